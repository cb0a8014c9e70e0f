#!/usr/bin/env bash
# One device call on the H200 (see .library/device): the GPU tests, then the whole stack with
# perf_analyzer driving it over HTTP (plain and with system shared memory). Python packages the
# image lacks travel as wheels in .whl/ and .carry/ (never committed); results go to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .carry/*.whl || exit 1
export PYTHONPATH=/tmp/site:libs/core/src:libs/client/src:libs/kernels/src:services/gateway/src:services/scheduler/src:services/executor/src:services/compiler/src:services/qos/src:services/compiler/tests
export PATH=$PWD/.carry/bin:/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi -L
echo "== GPU tests =="
python3 -m pytest -q -p no:cacheprovider -m gpu libs/kernels/tests/test_cuda_w4a16.py \
  services/compiler/tests/test_plan_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
echo "== stack + perf_analyzer =="
export ANVIL_RUN_ROOT=/tmp/anvil-run ANVIL_PROFILES=cpu ANVIL_ALLOW_CLIENT_SHM=1 ANVIL_SLO_P2_MS=5000
python3 -m anvil_client.cli up --no-restart --timeout 120 > "$OUT/stack.txt" 2>&1 &
UP=$!
for _ in $(seq 1 120); do curl -sf localhost:8000/v2/health/ready >/dev/null && break; sleep 1; done
curl -s localhost:8000/v2/health/ready; echo
PA=/tmp/site/perf_analyzer/bin/perf_analyzer; chmod +x "$PA"
for mode in none system; do
  timeout 120 "$PA" -m identity --service-kind=triton -i http -u localhost:8000 --shape INPUT0:256 \
    --concurrency-range 1:16:15 --measurement-interval 3000 --shared-memory $mode \
    --output-shared-memory-size 1024 2>&1 | tail -25 | tee "$OUT/perf_analyzer_$mode.txt"
done
kill -INT $UP; wait $UP
tail -3 "$OUT/stack.txt"
