#!/usr/bin/env bash
# Make this machine able to run the qos service's eBPF probes (bcc), then say what it could do.
#
# Idempotent; run as root on Debian 12 (CI calls it before `make test`). It never fails the run:
# whatever is impossible here (not root, no apt, no headers for this kernel, bcc cannot compile) is
# printed once with its reason, and the qos tests then skip with that same reason.
#
# Steps (see docs/qos.md, "Running it"):
#   1. mount tracefs (/sys/kernel/tracing) and debugfs (/sys/kernel/debug) when they are not mounted;
#   2. apt-get install bpfcc-tools python3-bpfcc (bcc's Python module lands in
#      /usr/lib/python3/dist-packages; anvil_qos adds that to sys.path when `import bcc` fails);
#   3. kernel headers: /lib/modules/$(uname -r)/build when it exists; otherwise Debian's nearest
#      linux-headers-<series>*-common and -amd64 debs (this kernel series, else 6.12), fetched with
#      `apt-get download`, unpacked with `dpkg-deb -x` and merged with `cp -as` into one tree;
#   4. write that tree's path to /var/tmp/anvil-bcc-kernel-source (read by anvil_qos when
#      BCC_KERNEL_SOURCE is unset) and print `export BCC_KERNEL_SOURCE=...`;
#   5. compile and load a one-tracepoint program with the system python and with the uv venv's, and
#      print the verdict.
set -uo pipefail

SOURCE_FILE=/var/tmp/anvil-bcc-kernel-source
WORK=/var/tmp/anvil-kheaders
FALLBACK_SERIES=6.12
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive

say() { echo "[prepare_ebpf] $*"; }
give_up() {
    say "eBPF NOT available: $*"
    say "qos will run in mode=procfs and its eBPF tests will skip with this reason"
    exit 0
}

if [[ "$(id -u)" != 0 ]]; then
    give_up "not root (eBPF needs CAP_BPF/CAP_SYS_ADMIN; mounting tracefs needs root)"
fi

# -- 1. tracefs / debugfs ------------------------------------------------------------------------
if [[ ! -d /sys/kernel/tracing/events ]]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
        && say "mounted tracefs at /sys/kernel/tracing" \
        || say "could not mount tracefs at /sys/kernel/tracing"
fi
if ! mountpoint -q /sys/kernel/debug; then
    # bcc reads tracepoint formats under /sys/kernel/debug/tracing (tracefs automounts there).
    mount -t debugfs nodev /sys/kernel/debug 2>/dev/null \
        && say "mounted debugfs at /sys/kernel/debug" \
        || say "could not mount debugfs at /sys/kernel/debug"
fi
[[ -d /sys/kernel/tracing/events || -d /sys/kernel/debug/tracing/events ]] \
    || give_up "tracefs is not mounted and cannot be mounted"
[[ -e /sys/kernel/btf/vmlinux ]] || say "note: no BTF at /sys/kernel/btf/vmlinux (bcc does not need it)"

# -- 2. bcc ----------------------------------------------------------------------------------------
APT_UPDATED=0
apt_update_once() {
    if [[ $APT_UPDATED == 0 ]]; then
        apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed (continuing with old lists)"
        APT_UPDATED=1
    fi
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

command -v apt-get >/dev/null || give_up "no apt-get (not Debian): install bcc by hand"
if installed bpfcc-tools && installed python3-bpfcc; then
    say "bcc already installed ($(dpkg-query -W -f='${Version}' python3-bpfcc))"
else
    apt_update_once
    apt-get install -y -qq --no-install-recommends bpfcc-tools python3-bpfcc >/dev/null 2>&1 \
        || give_up "apt-get install bpfcc-tools python3-bpfcc failed"
    say "installed bcc $(dpkg-query -W -f='${Version}' python3-bpfcc)"
fi

# -- 3. kernel headers -------------------------------------------------------------------------------
KSRC=""
if [[ -d "/lib/modules/$(uname -r)/build/include" ]]; then
    KSRC="/lib/modules/$(uname -r)/build"
    say "kernel headers for $(uname -r) are installed: $KSRC"
else
    series="$(uname -r | cut -d. -f1,2)"
    pick() {  # newest linux-headers-<series>.N+debXX-amd64 that apt knows
        apt-cache search --names-only "^linux-headers-${1//./\\.}\.[0-9]+\+deb[0-9]+-amd64$" 2>/dev/null \
            | awk '{print $1}' | sort -V | tail -1
    }
    apt_update_once
    arch_pkg="$(pick "$series")"
    if [[ -z "$arch_pkg" ]]; then
        say "no Debian headers for this kernel's series $series; using the $FALLBACK_SERIES series"
        arch_pkg="$(pick "$FALLBACK_SERIES")"
    fi
    [[ -n "$arch_pkg" ]] || give_up "apt knows no linux-headers-$series* or -$FALLBACK_SERIES* package"
    common_pkg="${arch_pkg%-amd64}-common"
    version="${arch_pkg#linux-headers-}"            # e.g. 6.12.117+deb12-amd64
    dir="$WORK/${version%-amd64}"
    merged="$dir/merged"
    if [[ -f "$merged/.anvil-complete" ]]; then
        say "headers already merged: $merged"
    else
        rm -rf "$dir" && mkdir -p "$dir/debs" "$dir/common" "$dir/arch" "$merged"
        # apt's _apt user cannot write into a root-owned folder; the download is then unsandboxed.
        (cd "$dir/debs" && apt-get download -q "$arch_pkg" "$common_pkg" >/dev/null 2>&1) \
            || give_up "apt-get download $arch_pkg $common_pkg failed"
        dpkg-deb -x "$dir"/debs/"${common_pkg}"_*.deb "$dir/common" \
            && dpkg-deb -x "$dir"/debs/"${arch_pkg}"_*.deb "$dir/arch" \
            || give_up "dpkg-deb -x failed on $dir/debs"
        csrc="$dir/common/usr/src/$common_pkg"
        asrc="$dir/arch/usr/src/$arch_pkg"
        # The -amd64 tree adds generated headers and .config over the -common tree. Its scripts/ and
        # tools/ are links into linux-kbuild (not fetched; bcc does not need them): keep common's.
        cp -as "$csrc/." "$merged/" || give_up "cp -as $csrc failed"
        for entry in "$asrc"/* "$asrc"/.config "$asrc"/.kernelvariables; do
            name="$(basename "$entry")"
            [[ "$name" == scripts || "$name" == tools || ! -e "$entry" ]] && continue
            cp -as --remove-destination "$entry" "$merged/" || give_up "cp -as $entry failed"
        done
        [[ -d "$merged/include/generated" && -f "$merged/include/linux/kconfig.h" ]] \
            || give_up "merged headers at $merged lack include/generated or kconfig.h"
        touch "$merged/.anvil-complete"
        say "merged $common_pkg + $arch_pkg into $merged"
    fi
    KSRC="$merged"
fi
echo "$KSRC" > "$SOURCE_FILE"
export BCC_KERNEL_SOURCE="$KSRC"
say "wrote $SOURCE_FILE"
echo "export BCC_KERNEL_SOURCE=$KSRC"

# -- 4. proof: compile + load one tracepoint program -------------------------------------------------
probe_py='
import sys
try:
    import bcc
except ImportError:
    sys.path.append("/usr/lib/python3/dist-packages")
    import bcc
b = bcc.BPF(text="TRACEPOINT_PROBE(sched, sched_switch) { return 0; }")
b.cleanup()
print("bcc", getattr(bcc, "__version__", "?"), "compiles and loads on", sys.executable)
'
check() {
    local py="$1" out
    if out="$("$py" -c "$probe_py" 2>&1)"; then
        say "$(echo "$out" | tail -1)"
        return 0
    fi
    say "bcc FAILS with $py: $(echo "$out" | grep -v '^\s*$' | tail -3 | tr '\n' ' ')"
    return 1
}
ok=0
check /usr/bin/python3 && ok=1
if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    check "$REPO_ROOT/.venv/bin/python" || ok=0
fi
if [[ $ok == 1 ]]; then
    say "eBPF available (BCC_KERNEL_SOURCE=$KSRC)"
else
    say "eBPF NOT available: see the bcc error above; qos will run in mode=procfs"
fi
exit 0
