"""Executor settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from anvil_core.settings import ServiceSettings

__all__ = ["ExecutorSettings"]


class ExecutorSettings(ServiceSettings):
    REDIS_ROLE: ClassVar[str] = "executor"
    metrics_port: int = 8004
    device: str = "cpu"
    # Largest batch this executor accepts; the scheduler never sends more.
    max_batch: int = 64
    # Batches in flight at once (flow-control credits): 2 keeps the device busy while the next
    # batch is received, without queueing work here that the scheduler could still re-order.
    credits: int = 2
    # Compute lanes: compute threads, each running its own instance of every compiled plan (on a GPU:
    # its own CUDA stream, graphs, activation and pinned banks, and a copy of the weights), so N
    # batches run at once in one process and one CUDA context (plan_runtime/lanes.py). The executor
    # advertises credits x lanes. Built-in numpy models are stateless and run on any lane. 1: one
    # compute thread, as before lanes existed.
    lanes: Annotated[int, Field(ge=1, le=16)] = 1
    # How long one thread may hold the GIL while another thread waits for it, µs (Python's switch
    # interval; 0: Python's default, 5,000). The executor's threads (I/O loop, prep, compute, lanes)
    # hand each other work: a compute thread back from the GPU can wait this long for a thread that
    # runs Python. Not changed by default until measured (docs/executor_gpu.md).
    gil_switch_us: Annotated[int, Field(ge=0, le=100_000)] = 0
    # Comma-separated built-in models to load at start-up. `minilm` (or `all-MiniLM-L6-v2`): the
    # compiled all-MiniLM-L6-v2 artifact, served under both names (models/minilm.py); skipped with
    # one log line saying why where its package or the compiler is missing.
    models: str = "identity,mlp,minilm"
    # A batch that finds the executor idle runs on the I/O loop itself, not the compute thread, when
    # its model's last batch took at most this long, µs (any device; a model that `prepare`s
    # prepares inline too): two thread switches fewer per batch (the compute thread's wake-up and
    # the result's hand-off back), which on 2 shared cores is ~0.1 ms per lone request. Bounded
    # because the loop neither receives nor beats while it computes. 0: never.
    inline_max_us: int = 2000
    # The `busy` stand-in device: t(B) = base + per_row x rows, sleeping (tests and simulations).
    busy_base_us: int = 4000
    busy_per_row_us: int = 500
    # Compiled artifacts (the compiler's volume); models deployed with `anvil deploy` load from here.
    artifact_dir: str = "/var/lib/anvil/artifacts"
    # Where the built-ins compiled here (minilm) are written and cached; empty: artifact_dir. Compose
    # mounts artifact_dir read-only (the compiler owns it), so it gives this a volume of its own.
    builtin_artifact_dir: str = ""
    # numpy's OpenBLAS threads for models' matmuls; 0 keeps OpenBLAS's own default (all cores).
    # 1 by default: after each call OpenBLAS's idle workers spin for milliseconds, taking the cores
    # that the gateway and scheduler on the same host need (mlp4x1024 at 64 clients on 2 cores:
    # 660-860 req/s at the default, 1,360-1,460 at 1; bench/serving_peers.py).
    blas_threads: int = 1
    # numba threads for models' CPU kernels (the plan runtime, anvil_kernels), set in every thread
    # that runs a model; 0 keeps numba's default (all cores). 1 by default for the same reason as
    # blas_threads: a parallel region waits at its barrier for every worker, and with the gateway
    # and scheduler on the same 2 cores a worker is often descheduled (all-MiniLM-L6-v2, 160-token
    # fp32 linear on a busy 2-core machine: 13-16 ms at 2 threads, 1.8 ms at 1).
    compute_threads: int = 1
    # How long numba's idle OpenMP workers spin after a parallel region before they sleep, in GNU
    # OpenMP's spin iterations (GOMP_SPINCOUNT; KMP_BLOCKTIME 0 where Intel's runtime is loaded). Its
    # default, 300,000, burnt 4.3 ms of a core after every region ended (measured: CPU time over a
    # 50 ms sleep after one region), i.e. after each batch, on the cores the gateway and scheduler need
    # to answer it; 10,000 burns 0.06 ms and still spans the gaps between a forward's regions. Set only
    # where the environment does not set GOMP_SPINCOUNT itself.
    omp_spin_count: int = 10_000
    # GPU plans (ANVIL_DEVICE=cuda:N): "cublas" runs fp32 linears on cuBLAS with the plan's epilogue
    # fused after it; "plan" runs every op with the compiler's kernels (CUDA cores only).
    gpu_gemm: Literal["cublas", "plan"] = "cublas"
    # fp32 GEMMs on tensor cores through TF32 (10-bit mantissa products, fp32 sums); measured
    # accuracy in docs/executor_gpu.md. False keeps full fp32 products.
    gpu_tf32: bool = True
    # Activations of a GPU plan: "auto" runs each plan in the precision the compiler recorded (fp16
    # for encoders unless deployed with --gpu-precision fp32); "fp32" forces fp32 (TF32 GEMMs);
    # "fp16" / "bf16" refuse a plan compiled without that precision's kernels (deploy with
    # --gpu-precision). docs/executor_gpu.md. "auto" since the fp16 GPU tests passed on the H200
    # (bench/results/gpu_tests.md, 2026-12-01, fourth session).
    gpu_precision: Literal["auto", "fp16", "bf16", "fp32"] = "auto"
    # Half plans: linears with a bias and no residual / LayerNorm (e.g. BERT's QKV) on cuBLASLt with the
    # bias (+ ReLU / tanh-GELU) in its epilogue, one pass less each (a shape cuBLASLt has no algorithm
    # for keeps cuBLAS + the epilogue kernel). On since measured (twenty-third session, H100,
    # bench/results/gpu_op_profile_23_h100.json, MiniLM fp16 plan alone, same run): back-to-back
    # graph 202.5 vs 213.2 µs at B = 1 T = 40, 245.0 vs 258.5 at 16 x 32, 585.3 vs 609.8 at 64 x 48.
    gpu_lt_epilogue: bool = True
    # Half plans' INT4 linears on the GEMV-like W4A16 kernels (M <= 16) launched as programmatic
    # dependents (sm_90 PDL): each streams its first weights while the kernel before it drains, then
    # waits before it reads x. Only where the artifact's w4a16.fatbin has kernels that wait (built
    # since the twenty-fourth session); an older artifact runs them plainly. On since measured
    # (twenty-fourth session, H100, bench/int4_gpu.py in process, 256 linears of 8192^2, bf16, same
    # artifact and run): graph 3,688 vs 4,081 µs at 1 row (1.107x), 1.065x at 4, 1.085x at 16;
    # the same outputs.
    gpu_pdl: bool = True
    # How the compute thread waits for a GPU batch: "spin" busy-waits on the stream (CUDA's own
    # default where a process has fewer contexts than the host has cores); "block" sleeps on a
    # blocking-sync CUDA event, giving its core back meanwhile. Measured on the H200 (MiniLM, 4
    # executors, spin/block interleaved twice, bench/results/gpu_sync_ab.md): spin served c16 at
    # 34.8k / 34.9k sentences/s, block at 30.0k / 33.2k; c1 and c64 within run-to-run noise. Spin stays.
    gpu_sync: Literal["block", "spin"] = "spin"
    # Built-ins on a GPU executor: "device" serves `mlp` and `mlp4x1024` as compiled plans on the GPU
    # (ONNX written from their seeded recipes, compiled once and cached in builtin_artifact_dir) and
    # `identity` as a round trip through device memory; "host" keeps them numpy on the host, as on a
    # CPU executor. `busy` always sleeps on the host; `minilm` is a compiled plan either way.
    gpu_builtins: Literal["device", "host"] = "device"
    # A model whose load fails is retried after load_retry_base_ms, doubling at each failure up to
    # load_retry_max_ms (a broken artifact costs one attempt a minute, not one a beat).
    load_retry_base_ms: int = 1000
    load_retry_max_ms: int = 60000
    # Accept inputs that stay in a client's shared memory (ZeroCopy, same host only).
    shm_inputs: bool = True
