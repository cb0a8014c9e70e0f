#!/usr/bin/env bash
# W4A16 kernels on one H200, in one device call (about 6-7 minutes): build the kernels with nvcc,
# test the wg (wgmma) tiles, the wgs (warp-specialized wg) tiles and the gv (shared-memory ring
# GEMV) configs alone (a faulting or
# hanging one is left out of the bench), run
# bench/kernels_gpu.py (while the full test fatbin builds), then the GPU tests of libs/kernels,
# then print a compact summary against issue #17's targets. Needs python3 with numpy, numba, cupy,
# torch and pytest, and nvcc; no network, no wheels. Results in $OUT (default /tmp/out):
#   kernels_gpu.{json,md}, w4a16_dispatch.json (measured dispatch table), bench.txt, gpu_tests.txt,
#   logs.txt (the wg/gv smoke tests' and the test build's output)
# Usage, from anywhere in the repo:  OUT=/some/dir bash bench/w4a16_device.sh
# Narrower runs: BENCH_ARGS (more kernels_gpu.py arguments, e.g. "--shapes 8192x8192 --ms 64,256
# --no-minilm"), TEST_CONFIGS (a Python tuple of the mtc/wg configs the test build holds; default
# all), TEST_GV (likewise the gv configs; default all), TEST_K (pytest -k expression).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the members' src folders, as bench/h200_gpu.sh (libs/kernels itself needs only numpy and numba)
SRC=libs/core/src:libs/client/src:libs/kernels/src:services/gateway/src:services/scheduler/src
SRC=$SRC:services/executor/src:services/compiler/src:services/qos/src
export PYTHONPATH=$PWD/${SRC//:/:$PWD/}${PYTHONPATH:+:$PYTHONPATH}
COMMIT=${ANVIL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # the device copy's git can be stale
[ -n "${ANVIL_COMMIT:-}" ] || echo "warning: ANVIL_COMMIT unset: the results name the device copy's git HEAD ($COMMIT), which can be stale"
BUILD=$(mktemp -d /tmp/anvil_w4a16.XXXXXX)
T0=$SECONDS
nvidia-smi -L || true
command -v nvcc >/dev/null || { echo "nvcc not on PATH"; exit 1; }

build() {  # build DIR PARAMS_EXPR JOBS: fatbins for sm_90a only (the wg kernels' wgmma needs it; one
  # pass), JOBS nvcc processes in parallel; prints the fatbins joined by ':' (what load_module and
  # the tests take)
  python3 -c "import os; from anvil_kernels.cuda import GV_CONFIGS, MTC_CONFIGS, W4A16Params, build_fatbins
print(os.pathsep.join(map(str, build_fatbins($2, ('compute_90a,code=sm_90a',), '$1', jobs=$3))))"
}
TEST_CONFIGS=${TEST_CONFIGS:-tuple(MTC_CONFIGS)}
TEST_GV=${TEST_GV:-tuple(GV_CONFIGS)}
NCPU=$(nproc)

echo "== build (bench kernels: bf16, g128) =="
BENCH_FATBIN=$(build "$BUILD/bench" \
  'W4A16Params(dtypes=("bf16",), groups=(128,), mtc_configs=tuple(MTC_CONFIGS), gv_configs=tuple(GV_CONFIGS))' "$NCPU")
echo "   $((SECONDS - T0)) s"
# every variant, for the tests, while the bench runs (the bench uses the GPU and one core)
build "$BUILD/all" "W4A16Params(mtc_configs=$TEST_CONFIGS, gv_configs=$TEST_GV)" "$((NCPU > 2 ? NCPU - 1 : 1))" \
  > "$OUT/build_all.txt" 2>&1 &
BUILD_PID=$!

# The wg (wgmma) tiles first, alone: a tile that faults (illegal instruction, trap) ends its CUDA
# context, and in the bench it would end every measurement after it. One shape, every M of the test.
# Then the warp-specialized wg tiles (wgs: bulk copies on mbarriers; a wrong phase spins forever)
# alone, under a shorter timeout; the GPU tests leave them out too if they fail.
EXCLUDE=""  # configs the bench leaves out (--exclude-configs, given once)
# tile_smoke NAME SECONDS K_EXPR CONFIG_FILTER: test_mtc_matches_twin on one family of tiles (bf16,
# g128, one shape, every M); on failure the configs CONFIG_FILTER selects (a Python expression over
# the MtcConfig v) go to EXCLUDE. Sets SMOKE_RC.
tile_smoke() {
  echo "== $1 smoke (test_mtc_matches_twin, $1 tiles, bf16 g128) =="
  SMOKE_RC=0
  ANVIL_W4A16_FATBIN="$BENCH_FATBIN" timeout "$2" python3 -m pytest -q -p no:cacheprovider -m gpu \
    -k "test_mtc_matches_twin and $3 and bf16 and 1024" libs/kernels/tests/test_cuda_w4a16_mtc.py \
    > "$OUT/$1_smoke.txt" 2>&1 || SMOKE_RC=$?
  tail -3 "$OUT/$1_smoke.txt"
  if [ "$SMOKE_RC" != 0 ]; then
    local cfgs
    cfgs=$(python3 -c "from anvil_kernels.cuda import MTC_CONFIGS; print(','.join(c for c, v in MTC_CONFIGS.items() if $4))")
    echo "   $1 smoke FAILED (rc=$SMOKE_RC): the bench leaves out $cfgs"
    EXCLUDE="$EXCLUDE,$cfgs"
  fi
}
tile_smoke wg 120 "wg and not wgs and not wgd" "v.wg and not v.ws"
WG_RC=$SMOKE_RC
# the tx tiles (x through a tensor map) apart from the other wgs tiles: their own smoke and exclusion
TXK=$(python3 -c "from anvil_kernels.cuda import MTC_CONFIGS; print(' or '.join(c for c, v in MTC_CONFIGS.items() if v.tx) or 'no_tx_config')")
tile_smoke wgs 60 "wgs and not ($TXK)" "v.ws and not v.dq and not v.tx"
WGS_RC=$SMOKE_RC
if [ "$WGS_RC" != 0 ]; then
  TEST_K="${TEST_K:+($TEST_K) and }not wgs"
fi
tile_smoke tx 60 "($TXK)" "v.tx"
TX_RC=$SMOKE_RC
if [ "$TX_RC" != 0 ]; then
  TEST_K="${TEST_K:+($TEST_K) and }not ($TXK)"
fi
# the wgd tiles (dequantizing warps, A from shared memory) likewise: their own rings and barriers
tile_smoke wgd 60 "wgd" "v.dq"
WGD_RC=$SMOKE_RC
if [ "$WGD_RC" != 0 ]; then
  TEST_K="${TEST_K:+($TEST_K) and }not wgd"
fi

# The gv configs likewise (their cp.async.bulk / mbarrier ring is new: a fault ends the context, a
# wrong mbarrier phase would spin forever): one test per config at bf16 g128, under a timeout.
echo "== gv smoke (test_gv_matches_twin, bf16 g128) =="
GV_RC=0
ANVIL_W4A16_FATBIN="$BENCH_FATBIN" timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "test_gv_matches_twin and bf16 and 1024" libs/kernels/tests/test_cuda_w4a16_gv.py \
  > "$OUT/gv_smoke.txt" 2>&1 || GV_RC=$?
tail -3 "$OUT/gv_smoke.txt"
if [ "$GV_RC" != 0 ]; then
  # rc 1 (tests failed): the failed configs; a timeout, a crash or nothing parsed: every gv config
  GV=$(python3 -c "
import re, sys
from anvil_kernels.cuda import GV_CONFIGS
failed = set(re.findall(r'FAILED \S+?\[[^\]]*?\b(gv[a-z0-9]+)\b', open(sys.argv[1]).read()))
print(','.join(c for c in GV_CONFIGS if c in failed or sys.argv[2] != '1' or not failed))
" "$OUT/gv_smoke.txt" "$GV_RC")
  echo "   gv smoke FAILED (rc=$GV_RC): the bench leaves out $GV"
  EXCLUDE="$EXCLUDE,$GV"
fi
if [ -n "$EXCLUDE" ]; then
  BENCH_ARGS="${BENCH_ARGS:-} --exclude-configs ${EXCLUDE#,}"
fi

echo "== bench/kernels_gpu.py =="
BENCH_RC=0
# shellcheck disable=SC2086  # BENCH_ARGS: several arguments
timeout 240 python3 bench/kernels_gpu.py --fatbin "$BENCH_FATBIN" --out "$OUT" \
  --commit "$COMMIT" ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1 || BENCH_RC=$?
grep -E "^K=|Error|error|Traceback|failed" "$OUT/bench.txt" | cut -c1-240 || true
echo "   bench rc=$BENCH_RC, $((SECONDS - T0)) s"

echo "== GPU tests (libs/kernels) =="
BUILD_RC=0
wait "$BUILD_PID" || BUILD_RC=$?
TEST_RC=0
if [ "$BUILD_RC" = 0 ]; then
  # the new kernel's tests first, so that a cut-off run still reports them
  ANVIL_W4A16_FATBIN=$(tail -1 "$OUT/build_all.txt") timeout 190 python3 -m pytest -q -p no:cacheprovider \
    -m gpu --maxfail=20 -rs ${TEST_K:+-k "$TEST_K"} libs/kernels/tests/test_cuda_pdl.py \
    libs/kernels/tests/test_cuda_w4a16_gv.py \
    libs/kernels/tests/test_cuda_w4a16_mtc.py libs/kernels/tests/test_cuda_w4a16.py \
    libs/kernels/tests/test_cuda_w4a16_tc.py > "$OUT/gpu_tests.txt" 2>&1 || TEST_RC=$?
  tail -25 "$OUT/gpu_tests.txt"
else
  TEST_RC=$BUILD_RC
  tail -20 "$OUT/build_all.txt"
fi
echo "   tests rc=$TEST_RC, $((SECONDS - T0)) s"

echo "== summary =="
python3 - "$OUT/kernels_gpu.json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
print(f"{d['meta']['device']}  commit {d['meta']['commit']}  empty kernel {d['meta']['empty_us']} us  "
      f"bench wall {d['meta'].get('wall_s')} s")
print(f"{'K x N':>13} {'M':>4} {'stream':>7} {'gemv':>7} {'gemv-like best':>14} {'mtc best':>19} {'tc old':>19} {'best tile':>19} "
      f"{'cuBLAS':>7} {'tinygemm':>8} {'INT4/cuBLAS':>11}")
def cell(t):
    return f"{t['us']:>8} {t['cfg']:>7}/{t['split']!s:<3}" if t else f"{'-':>19}"
slower = []
for r in rows:
    ratio = r["best_int4_us"] / r["cublas_us"]
    if not ratio <= 1.0:
        slower.append(f"{r['K']}x{r['N']} M={r['M']} ({ratio:.2f})")
    gb = r.get("gemv_best") or {"us": "-", "cfg": "-"}
    print(f"{r['K']:>6}x{r['N']:<6} {r['M']:>4} {r['stream_us']:>7} {r['gemv_us']:>7} {gb['us']:>7}/{gb['cfg']:<6} "
          f"{cell(r.get('mtc_best'))} "
          f"{cell(r.get('tc_old_best'))} {cell(r['tc_best'])} {r['cublas_us']:>7} {r['tinygemm_us']:>8} "
          f"{ratio:>11.2f}")
at = {(r["K"], r["N"], r["M"]): r for r in rows}
print("targets (issue #17; best INT4 = the fastest kernel that passed the error bound, what the table picks):")
for (k, n) in ((8192, 8192), (4096, 14336), (14336, 4096)):
    t = [f"{k}x{n}:"]
    for m, goal in ((1, 12.0), (16, 13.0), (64, 20.0), (256, None)):
        r = at.get((k, n, m))
        if not r:
            continue
        b, cb = r["best_int4_us"], r["cublas_us"]
        hit = b <= goal if goal else b <= 0.9 * cb
        want = f"<= {goal} us" if goal else f"<= {0.9 * cb:.1f} (0.9 cuBLAS)"
        t.append(f"M={m} {b:.1f} us {r['best_kernel']} [{want}: {'MET' if hit else 'missed'}]")
        pb = r.get("gemv_best_pdl")
        if goal and pb:  # the GEMV-like kernels launched as programmatic dependents (PDL)
            t.append(f"(PDL {pb['us']:.1f} us {pb['cfg']}: {'MET' if pb['us'] <= goal else 'missed'}; "
                     f"stream {r['stream_us']}, stream PDL {r.get('stream_pdl_us')})")
        for key, name in (("tile_pdl", "tile PDL"), ("tile_pdl_late", "tile PDL late")):
            tp = r.get(key)
            if tp:  # a wgs best tile launched as programmatic dependents (late: trigger after the wait)
                hit = tp["us"] <= goal if goal else tp["us"] <= 0.9 * cb
                t.append(f"({name} {tp['us']:.1f} us {tp['cfg']}/{tp['split']}: {'MET' if hit else 'missed'})")
    print("  ".join(t))
print("INT4 slower than cuBLAS bf16 (the table marks bf16_faster) at:", ", ".join(slower) or "none")
EOF
# what the run would change in the packaged dispatch table (bench/refresh_table.py writes it on
# the build machine; it refuses a run on any device but an H200)
[ -f "$OUT/w4a16_dispatch.json" ] && { echo "== the packaged table, if refreshed from this run =="
  python3 bench/refresh_table.py "$OUT/w4a16_dispatch.json" --dry-run 2>&1 | tail -30 || true; }
echo "wg smoke rc=$WG_RC  wgs smoke rc=$WGS_RC  tx smoke rc=$TX_RC  wgd smoke rc=$WGD_RC  gv smoke rc=$GV_RC  bench rc=$BENCH_RC  tests rc=$TEST_RC  total $((SECONDS - T0)) s  (outputs in $OUT)"
# a device call brings back at most 8 files: the three smaller logs as one (logs.txt), so that the
# results (kernels_gpu.{json,md}, w4a16_dispatch.json) and the bench and test logs always fit
for f in wg_smoke wgs_smoke tx_smoke wgd_smoke gv_smoke build_all; do
  [ -f "$OUT/$f.txt" ] && { echo "== $f.txt"; cat "$OUT/$f.txt"; rm -f "$OUT/$f.txt"; }
done > "$OUT/logs.txt"
[ "$BENCH_RC" = 0 ] && [ "$TEST_RC" = 0 ]
