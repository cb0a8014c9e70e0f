#!/usr/bin/env bash
# One device call on a GPU host: bench/h200_gpu.sh's stack phases (identity hops with `anvil bench`,
# perf_analyzer if PA=1, MiniLM without peers) run ROUNDS times with this tree's defaults ("new") and
# with AB_ENV set ("base", e.g. AB_ENV="ANVIL_DIRECT_ANSWERS=0"), the order alternating every round
# so that drift hits both. Each run's figures go to $OUT/ab_summary.txt (one block per run) and its
# MiniLM table to $OUT/minilm_<label>_<round>.md (a call brings back only a few files).
#
#   ANVIL_COMMIT=<sha> AB_ENV="ANVIL_DIRECT_ANSWERS=0" ROUNDS=2 OUT=$OUT bash bench/h200_ab.sh
#
# Needs what bench/h200_gpu.sh needs (the carried .whl/ and .carry/minilm; .pa/ for PA=1).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${AB_ENV:?set AB_ENV to the setting of the base runs, e.g. ANVIL_DIRECT_ANSWERS=0}"
ROUNDS=${ROUNDS:-2}
for r in $(seq 1 "$ROUNDS"); do
  order="new base"; [ $((r % 2)) = 0 ] && order="base new"
  for label in $order; do
    sub=/tmp/ab/${label}_$r; mkdir -p "$sub"
    extra=(); [ "$label" = base ] && read -r -a extra <<< "$AB_ENV"
    start=$(date +%s)
    env "${extra[@]}" OUT="$sub" SKIP_TESTS=1 SKIP_SMOKE=1 SKIP_INT4=1 HOPS=1 PA="${PA:-0}" PA_PROTOS=http \
      PA_MODELS=identity MINILM_ARGS="--no-peers" bash "$(dirname "$0")/h200_gpu.sh" > "$sub.log" 2>&1
    {
      echo "== round $r, $label (${extra[*]:-defaults}), $(( $(date +%s) - start )) s"
      grep -E "^anvil [0-9]+ sentences|^sent |hops ms|concurrency|p50 latency|Throughput" "$sub.log"
    } | tee -a "$OUT/ab_summary.txt"
    cp "$sub/minilm_gpu.md" "$OUT/minilm_${label}_$r.md" 2>/dev/null
  done
done
