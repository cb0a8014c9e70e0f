#!/usr/bin/env bash
# W4A16 kernels on one H200, in one device call (under 5 minutes): build the kernels with nvcc,
# run bench/kernels_gpu.py (while the full test fatbin builds), then the GPU tests of libs/kernels,
# then print a compact summary against issue #17's targets. Needs python3 with numpy, numba, cupy,
# torch and pytest, and nvcc; no network, no wheels. Results in $OUT (default /tmp/out):
#   kernels_gpu.{json,md}, w4a16_dispatch.json (measured dispatch table), bench.txt, gpu_tests.txt
# Usage, from anywhere in the repo:  OUT=/some/dir bash bench/w4a16_device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the members' src folders, as bench/h200_gpu.sh (libs/kernels itself needs only numpy and numba)
SRC=libs/core/src:libs/client/src:libs/kernels/src:services/gateway/src:services/scheduler/src
SRC=$SRC:services/executor/src:services/compiler/src:services/qos/src
export PYTHONPATH=$PWD/${SRC//:/:$PWD/}${PYTHONPATH:+:$PYTHONPATH}
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILD=$(mktemp -d /tmp/anvil_w4a16.XXXXXX)
T0=$SECONDS
nvidia-smi -L || true
command -v nvcc >/dev/null || { echo "nvcc not on PATH"; exit 1; }

build() {  # build DIR PARAMS_EXPR JOBS: fatbins for sm_90 (no wgmma: no sm_90a pass), JOBS nvcc
  # processes in parallel; prints the fatbins joined by ':' (what load_module and the tests take)
  python3 -c "import os; from anvil_kernels.cuda import W4A16Params, build_fatbins
print(os.pathsep.join(map(str, build_fatbins($2, ('compute_90,code=sm_90',), '$1', jobs=$3))))"
}
NCPU=$(nproc)

echo "== build (bench kernels: bf16, g128) =="
BENCH_FATBIN=$(build "$BUILD/bench" 'W4A16Params(dtypes=("bf16",), groups=(128,))' "$NCPU")
echo "   $((SECONDS - T0)) s"
# every variant, for the tests, while the bench runs (the bench uses the GPU and one core)
build "$BUILD/all" 'W4A16Params()' "$((NCPU > 2 ? NCPU - 1 : 1))" > "$OUT/build_all.txt" 2>&1 &
BUILD_PID=$!

echo "== bench/kernels_gpu.py =="
BENCH_RC=0
timeout 170 python3 bench/kernels_gpu.py --fatbin "$BENCH_FATBIN" --out "$OUT" \
  --commit "$COMMIT" > "$OUT/bench.txt" 2>&1 || BENCH_RC=$?
grep -E "^K=|Error|error|Traceback" "$OUT/bench.txt" | cut -c1-220 || true
echo "   bench rc=$BENCH_RC, $((SECONDS - T0)) s"

echo "== GPU tests (libs/kernels) =="
BUILD_RC=0
wait "$BUILD_PID" || BUILD_RC=$?
TEST_RC=0
if [ "$BUILD_RC" = 0 ]; then
  ANVIL_W4A16_FATBIN=$(tail -1 "$OUT/build_all.txt") timeout 150 python3 -m pytest -q -p no:cacheprovider \
    -m gpu --maxfail=20 -rs libs/kernels/tests/test_cuda_w4a16.py libs/kernels/tests/test_cuda_w4a16_tc.py \
    > "$OUT/gpu_tests.txt" 2>&1 || TEST_RC=$?
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
print(f"{d['meta']['device']}  commit {d['meta']['commit']}  empty kernel {d['meta']['empty_us']} us")
print(f"{'K x N':>13} {'M':>4} {'stream':>7} {'gemv':>8} {'tc best':>16} {'dispatch':>15} {'cuBLAS':>8} "
      f"{'tinygemm':>9} {'d/cuBLAS':>8}")
slower = []
for r in rows:
    tb, dc = r["tc_best"], r["dispatch_choice"]["kernel"]
    ratio = r["dispatch_us"] / r["cublas_us"]
    if ratio > 1.0:
        slower.append(f"{r['K']}x{r['N']} M={r['M']} ({ratio:.2f})")
    print(f"{r['K']:>6}x{r['N']:<6} {r['M']:>4} {r['stream_us']:>7} {r['gemv_us']:>8} "
          f"{tb['us']:>8} {tb['cfg']:>5}/{tb['split']:<2} {r['dispatch_us']:>8} {dc:>6} "
          f"{r['cublas_us']:>8} {r['tinygemm_us']:>9} {ratio:>8.2f}")
at = {(r["K"], r["N"], r["M"]): r for r in rows}
def best(r):  # the measured best INT4 kernel (what the written dispatch table picks)
    return min(r["gemv_us"], r["tc_best"]["us"])
for (k, n) in sorted({(r["K"], r["N"]) for r in rows}):
    t = [f"{k}x{n}:"]
    for m, goal in ((1, "<= 12 us"), (16, "<= 13 us"), (64, "<= 20 us"), (256, "<= 0.9 cuBLAS")):
        r = at.get((k, n, m))
        if r:
            t.append(f"M={m} best {best(r):.1f} us ({goal}; cuBLAS {r['cublas_us']}, x{best(r) / r['cublas_us']:.2f})")
    print("  ".join(t))
print("dispatch slower than cuBLAS at:", ", ".join(slower) or "none")
EOF
echo "bench rc=$BENCH_RC  tests rc=$TEST_RC  total $((SECONDS - T0)) s  (outputs in $OUT)"
[ "$BENCH_RC" = 0 ] && [ "$TEST_RC" = 0 ]
