#!/usr/bin/env bash
# One device call on a GPU host (see docs/executor_gpu.md): `make test-gpu`, then the whole stack with
# its executor on cuda:0 serving compiled models (bench/gpu_stack.py). Python packages the image
# lacks travel as wheels in .whl/ (bench/h200_env.sh installs them), the fp16 MiniLM in
# .carry/minilm, perf_analyzer in .pa/ (none committed); results go to $OUT. PEERS_ALONE=1 first times
# MiniLM's peers with the stack down (bench/minilm_gpu.py --peers-only). OP_PROFILE=1 also times
# the fp16 MiniLM plan alone per shape (bench/gpu_op_profile.py, OP_SHAPES) between the tests and the stack.
# MPS=1 runs the stack under a CUDA MPS control daemon of its own (quit at the end). CLIENT_AB=1 times a
# lone MiniLM sentence through the stack by http.client and by http_load.Wire (bench/client_overhead.py).
source "$(dirname "$0")/h200_env.sh"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== make test-gpu =="
  # the real all-MiniLM-L6-v2 checkpoint for test_gpu_fp16's accuracy test, where it is carried
  [ -d .carry/minilm ] && export ANVIL_TEST_MINILM_DIR=$PWD/.carry/minilm
  if [ -n "${TEST_FILES:-}" ]; then  # only these GPU test files (a re-run of what failed)
    python3 -m pytest -m gpu -q -p no:cacheprovider -rs $TEST_FILES 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
  else
    make test-gpu GPU_PY=python3 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
  fi
fi
if [ "${OP_PROFILE:-0}" = 1 ] && [ -d .carry/minilm ]; then  # the MiniLM plan alone: graph and kernels per shape
  echo "== bench/gpu_op_profile.py =="
  timeout 150 python3 bench/gpu_op_profile.py --model-dir .carry/minilm --variants "${OP_VARIANTS:-fp16}" \
    --shapes "${OP_SHAPES:-1x16,1x64,16x32,64x48}" --out "$OUT/gpu_op_profile.json" 2>&1 | grep -E "B=|wrote|Error"
fi
[ "${SKIP_STACK:-0}" = 1 ] && exit 0
if [ "${MPS:-0}" = 1 ]; then
  # CUDA MPS: the executor processes sharing the GPU submit through one MPS server, so their kernels
  # run side by side instead of time-slicing four contexts. A user-space daemon (no GPU setting
  # changes); its pipe and log folders are private to this run, and it is told to quit on exit.
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/anvil-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/anvil-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    trap 'echo quit | nvidia-cuda-mps-control; sleep 1' EXIT
    echo "MPS control daemon started"
  else
    echo "MPS: nvidia-cuda-mps-control could not start; running without MPS"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
if [ "${PEERS_ALONE:-0}" = 1 ] && [ -d .carry/minilm ]; then
  # the peers (infinity-emb, sentence-transformers) with the GPU and the cores to themselves, before
  # the stack starts: bench/minilm_gpu.py reports them beside the peers it measures next to the stack
  echo "== MiniLM peers alone =="
  timeout 300 python3 bench/minilm_gpu.py --model-dir .carry/minilm --out-dir "$OUT" --peers-only \
    ${MINILM_ARGS:-} 2>&1 | grep -E "sentences_per_s|what|not measured" | tail -24
fi
echo "== stack on cuda:0 =="
export ANVIL_RUN_ROOT=/tmp/anvil-run ANVIL_PROFILES=gpu ANVIL_SLO_P2_MS=5000
export ANVIL_GPU_PRECISION=${ANVIL_GPU_PRECISION:-auto}  # the plans' precision (fp16 for encoders), the default
export ANVIL_HTTP_WORKERS=${ANVIL_HTTP_WORKERS:-8}  # gateway processes on the HTTP port (16-core host)
python3 -m anvil_client.cli up --no-restart --timeout 180 > "$OUT/stack.txt" 2>&1 &
UP=$!
for _ in $(seq 1 180); do curl -sf localhost:8000/v2/health/ready >/dev/null && break; sleep 1; done
curl -s localhost:8000/v2/health/ready; echo
if [ "${BUILTINS:-0}" = 1 ]; then  # the built-ins on the GPU (ANVIL_GPU_BUILTINS): platform and error vs numpy
  timeout 60 python3 bench/gpu_builtins_check.py --out "$OUT/gpu_builtins.json" 2>&1 | tail -8
fi
if [ "${PA:-0}" = 1 ] && [ -f /tmp/site/perf_analyzer/bin/perf_analyzer ]; then
  # perf_analyzer (pip perf-analyzer, carried in .pa/: glibc 2.38, not runnable on the build machine)
  # over HTTP and gRPC, identity and mlp (PA_PROTOS, PA_MODELS choose), c1 and c16; server-side
  # stats in its output
  PAB=/tmp/site/perf_analyzer/bin/perf_analyzer; chmod +x "$PAB"
  for proto in ${PA_PROTOS:-http grpc}; do
    url=localhost:8000; [ $proto = grpc ] && url=localhost:8001
    for model in ${PA_MODELS:-identity mlp}; do
      shape=INPUT0:256; [ $model = mlp ] && shape=INPUT0:16
      timeout 100 "$PAB" -m $model --service-kind=triton -i $proto -u $url --shape $shape \
        --concurrency-range 1:16:15 --measurement-interval 3000 2>&1 | tee "$OUT/pa_${proto}_${model}.txt" \
        | grep -E "concurrency|Throughput|p50 latency|p99 latency|Avg request latency|queue|compute" | head -24
    done
  done
fi
if [ "${HOPS:-0}" = 1 ]; then
  # identity (1 KB binary, KServe HTTP) through the stack with `anvil bench`, c1 and c16: the gateway's
  # per-hop split of each answer (transit's parts: docs/scheduler.md "Per-hop timing"), per priority
  for c in 1 16; do
    timeout 60 python3 -m anvil_client.cli bench --model identity --binary --concurrency $c --duration 6 \
      --name "hops_identity_c$c" --out /tmp/hops 2>&1 | grep -E "^sent|hops ms" | tee -a "$OUT/hops_identity.txt"
  done
fi
# direct requests (docs/scheduler.md): how many lone requests each gateway process sent an executor
# itself so far, and how many came back busy or lost (worker i's metrics port: 8002 + 100 i)
direct_counts() {
  for i in $(seq 0 $((ANVIL_HTTP_WORKERS - 1))); do
    curl -s "localhost:$((8002 + 100 * i))/metrics" | grep '^anvil_gateway_direct_requests_total'
  done | awk -v at="$1" '{split($1, a, "\""); n[a[2]] += $2} END {
    printf "direct requests %s:", at; for (k in n) printf " %s %d", k, n[k]; print ""}'
}
[ "${HOPS:-0}" = 1 ] && direct_counts "after the identity loads"
[ "${SKIP_SMOKE:-0}" = 1 ] || timeout 400 python3 bench/gpu_stack.py --out "$OUT/gpu_stack.json" 2>&1 | tail -60
if [ -d .carry/minilm ] && [ "${SKIP_MINILM:-0}" != 1 ]; then  # all-MiniLM-L6-v2, fp16 safetensors + tokenizer (45 MB)
  ALONE=""; [ -f "$OUT/minilm_peers_alone.json" ] && ALONE="--peers-alone $OUT/minilm_peers_alone.json"
  # shellcheck disable=SC2086  # MINILM_ARGS, ALONE: several arguments
  timeout 500 python3 bench/minilm_gpu.py --model-dir .carry/minilm --out-dir "$OUT" ${MINILM_ARGS:-} $ALONE \
    2>&1 | tail -40
  direct_counts "after the MiniLM loads"
  if [ "${CLIENT_AB:-0}" = 1 ]; then  # a lone sentence by http.client vs http_load.Wire, same stack
    timeout 180 python3 bench/client_overhead.py --url http://127.0.0.1:8000 --model minilm-gpu \
      --requests 2000 --rounds 4 --out-dir "$OUT" --out-name client_overhead_gpu 2>&1 | tail -9
  fi
  curl -s localhost:8003/metrics | grep -E "^anvil_scheduler_(target_batch|batch_ceiling|batch_size_(sum|count)|batch_rtt_us_(sum|count)|pid_measured)" \
    | tee "$OUT/scheduler_batching.txt"
  if [ "${PROFILE:-0}" = 1 ]; then  # py-spy (carried in .whl) on each service under c64 load
    # py-spy's raw stacks stay on the host ($OUT brings back at most 8 files); the summary comes back
    mkdir -p /tmp/profile
    PATH=/tmp/site/bin:$PATH timeout 120 python3 bench/profile_stack.py --concurrency "${PROFILE_CONC:-64}" \
      --out-dir /tmp/profile ${PROFILE_ARGS:-} 2>&1 | tail -80
    cp /tmp/profile/profile_stack.json "$OUT/" 2>/dev/null
    curl -s localhost:8003/metrics | grep -E "^anvil_scheduler_batch_size_(sum|count)" | tee "$OUT/batch.txt"
  fi
  if [ -n "${STEADY_MIN:-}" ]; then  # executor RSS and device memory under sustained c16 load (#16)
    timeout $((STEADY_MIN * 60 + 120)) python3 bench/steady_state.py --model minilm-gpu \
      --minutes "$STEADY_MIN" --out-dir "$OUT" 2>&1 | tail -30
  fi
fi
if [ "${SKIP_INT4:-0}" != 1 ]; then  # weight-bound model (4 x 8192^2): INT4 (W4A16) vs fp16 weights, same run
  timeout 900 python3 bench/int4_gpu.py --out-dir "$OUT" ${INT4_ARGS:-} 2>&1 | tail -40
fi
kill -INT $UP; wait $UP
for f in /tmp/anvil-run/*/*.log; do echo "== $f"; tail -c 3000 "$f"; done > "$OUT/service_logs.txt"
grep -i "cuda\|error\|Traceback" "$OUT/service_logs.txt" | tail -40
