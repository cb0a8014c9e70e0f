#!/usr/bin/env bash
# One device call on a GPU host: bench/gpu_scale.py (executors per GPU and GPUs, MiniLM through the
# whole stack; docs/executor_gpu.md) within BUDGET_S seconds (default 400: ~7 minutes with the
# set-up), results in $OUT/gpu_scale.{json,md} and the services' log tails in $OUT/scale_logs.txt.
# Needs the carried wheels (.whl/, bench/h200_env.sh) and the fp16 MiniLM in .carry/minilm.
#   ANVIL_COMMIT=<sha> bash bench/h200_scale.sh              # the tree sent (the device's git is stale)
#   CONFIGS="gpus=0,epg=1;gpus=0+1,epg=1" INT4=1 BUDGET_S=500 bash bench/h200_scale.sh   # issue #21
source "$(dirname "$0")/h200_env.sh"
[ -d .carry/minilm ] || { echo "bench/h200_scale.sh: no .carry/minilm (the fp16 MiniLM checkpoint)"; exit 1; }
export ANVIL_SLO_P2_MS=${ANVIL_SLO_P2_MS:-5000}  # as bench/h200_gpu.sh: closed-loop load, not SLO tests
export ANVIL_GPU_PRECISION=${ANVIL_GPU_PRECISION:-auto}  # the plans' precision (fp16 for encoders)
export ANVIL_HTTP_WORKERS=${ANVIL_HTTP_WORKERS:-8}  # gateway processes on the HTTP port (16-core host)
CONFIGS=${CONFIGS:-"gpus=0,epg=1;gpus=0,epg=2;gpus=0,epg=4;gpus=0+1,epg=1"}
BUDGET_S=${BUDGET_S:-400}
WORK=/tmp/anvil-scale
ARGS=(--model-dir .carry/minilm --configs "$CONFIGS" --budget-s "$BUDGET_S" --out-dir "$OUT" --work-dir "$WORK")
[ "${INT4:-0}" = 1 ] && ARGS+=(--int4)
# the budget is checked between phases; the timeout only bounds a wedged phase (rows are written
# after each configuration)
timeout $((BUDGET_S + 90)) python3 bench/gpu_scale.py "${ARGS[@]}" ${SCALE_ARGS:-} 2>&1 | tee "$OUT/gpu_scale.log" | tail -80
for f in "$WORK"/*/up.log "$WORK"/*/*/*.log; do [ -f "$f" ] && { echo "== $f"; tail -c 2000 "$f"; }; done \
  > "$OUT/scale_logs.txt"
grep -i "cuda error\|Traceback\|exited with" "$OUT/scale_logs.txt" | tail -20
