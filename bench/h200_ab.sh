#!/usr/bin/env bash
# One device call on a GPU host: bench/h200_gpu.sh's stack phases (identity hops with `anvil bench`,
# perf_analyzer if PA=1, MiniLM without peers) run ROUNDS times with this tree's defaults ("new") and
# a base ("base"), the order alternating every round (new base, base new, ...) so that drift hits both.
# The base is this tree with AB_ENV set (e.g. AB_ENV="ANVIL_DIRECT_ANSWERS=0"), or another tree:
# AB_TREE=<a .tgz of it, e.g. `git archive <sha> ... | gzip > .src/base.tgz`, carried in an ignored
# folder> with AB_COMMIT=<its sha> (its device copy has no git), AB_ENV then optional. Each run's
# figures go to $OUT/ab_summary.txt (one block per run) and its MiniLM results to
# $OUT/minilm_<label>_<round>.json (a call brings back at most 8 files: ROUNDS <= 3).
#
#   ANVIL_COMMIT=<sha> AB_ENV="ANVIL_DIRECT_ANSWERS=0" ROUNDS=2 OUT=$OUT bash bench/h200_ab.sh
#   ANVIL_COMMIT=<sha> AB_TREE=.src/base.tgz AB_COMMIT=<base sha> ROUNDS=2 OUT=$OUT bash bench/h200_ab.sh
#
# MINILM_ARGS (default "--no-peers") goes to bench/minilm_gpu.py. Needs what bench/h200_gpu.sh needs
# (the carried .whl/ and .carry/minilm; .pa/ for PA=1); with AB_TREE they are linked into the base.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/.." && pwd)
BASE_DIR=$HERE
if [ -n "${AB_TREE:-}" ]; then
  BASE_DIR=/tmp/ab_base; rm -rf "$BASE_DIR"; mkdir -p "$BASE_DIR"
  tar xzf "$AB_TREE" -C "$BASE_DIR" || exit 1
  for p in .whl .whl_peers .carry .pa; do [ -e "$HERE/$p" ] && ln -s "$HERE/$p" "$BASE_DIR/$p"; done
else
  : "${AB_ENV:?set AB_ENV to the setting of the base runs (e.g. ANVIL_DIRECT_ANSWERS=0), or AB_TREE}"
fi
ROUNDS=${ROUNDS:-2}
for r in $(seq 1 "$ROUNDS"); do
  order="new base"; [ $((r % 2)) = 0 ] && order="base new"
  for label in $order; do
    sub=/tmp/ab/${label}_$r; mkdir -p "$sub"
    extra=(); dir=$HERE; commit=${ANVIL_COMMIT:-}
    if [ "$label" = base ]; then
      [ -n "${AB_ENV:-}" ] && read -r -a extra <<< "$AB_ENV"
      dir=$BASE_DIR; [ -n "${AB_TREE:-}" ] && commit=${AB_COMMIT:-base}
    fi
    start=$(date +%s)
    (cd "$dir" && env "${extra[@]}" ANVIL_COMMIT="$commit" OUT="$sub" SKIP_TESTS=1 SKIP_SMOKE=1 SKIP_INT4=1 \
      HOPS=1 PA="${PA:-0}" PA_PROTOS=http PA_MODELS=identity MINILM_ARGS="${MINILM_ARGS:---no-peers}" \
      bash bench/h200_gpu.sh > "$sub.log" 2>&1)
    {
      echo "== round $r, $label (${extra[*]:-defaults}; tree $dir, commit ${commit:-?}), $(( $(date +%s) - start )) s"
      grep -E "^anvil [0-9]+ sentences|^sent |hops ms|concurrency|p50 latency|Throughput|^direct requests" "$sub.log"
    } | tee -a "$OUT/ab_summary.txt"
    cp "$sub/minilm_gpu.json" "$OUT/minilm_${label}_$r.json" 2>/dev/null
  done
done
