"""`GpuPlanModel`: a compiled artifact served on one CUDA device.

Load (once per model):
  1. a ``DeviceArena`` with a weights and an activations bank at the plan's sizes (refused with the
     sizes when the device lacks the memory), every weight copied to its planned offset;
  2. the kernel module loaded once (the artifact's cubin for this arch, else its fatbin, else its
     ``kernels.cu`` compiled by CuPy's NVRTC), every kernel function looked up once;
  3. a ``PinnedBank`` holding one slot per public input and output at its largest size;
  4. per shape bucket (buckets.py) the launch table resolved to device addresses and captured, with
     the input copies before it and the output copies after it, into one CUDA graph.

Precision (precision.py): an fp32 plan runs as compiled (TF32 GEMMs); an fp16 plan (the compiler's
default for encoders) stores activations and linear weights fp16, runs its linears on cuBLAS fp16 or
the W4A16 kernels (gpu_linear.py) and every other op with its ``kernel_f16``, and converts public fp32
inputs and outputs in the pinned bank, so clients see the model spec's dtypes. A bf16 plan (deployed
with ``--gpu-precision bf16``) does the same in bf16 with its ``kernel_bf16``.

Run (per chunk of a batch): each request's rows are unpacked straight into the pinned input slots
at the bucket's shape (zero padding: mask 0, row 0), one graph launch does host-to-device copies,
every kernel and device-to-host copies on the model's stream, one synchronize, and each request
gets a copy of its rows. Nothing is allocated on the device and no module is loaded per batch
(``cuda_arena.counter`` proves it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anvil_core.logs import get_logger
from anvil_core.model_spec import SpecError
from anvil_executor.models.base import RequestInputs
from anvil_executor.plan_runtime.arena import ALIGN
from anvil_executor.plan_runtime.buckets import Buckets
from anvil_executor.plan_runtime.cublas_linear import EPILOGUE_SOURCE, GemmStep, epilogue_launch, gemm_ops
from anvil_executor.plan_runtime.cublas_raw import Gemm
from anvil_executor.plan_runtime.cublaslt_raw import LtGemm
from anvil_executor.plan_runtime.cuda_arena import DeviceArena, PinnedBank, counter
from anvil_executor.plan_runtime.gpu_linear import EPILOGUE_F16_SOURCE, EPILOGUE_KERNELS, F16Linears
from anvil_executor.plan_runtime.io import PlanIO, _l
from anvil_executor.plan_runtime.launch import Launch, resolve_launches
from anvil_executor.plan_runtime.plan import DTYPES, LoadedPlan, _s, load_plan
from anvil_executor.plan_runtime.precision import (
    BF16,
    HALF,
    device_dtypes,
    half_kernels,
    resolve_precision,
    to_f32,
    to_half,
)

__all__ = ["PHASES", "GpuPlanModel", "load_module"]

log = get_logger("anvil.executor.gpu")
H2D, D2H = 1, 2  # cudaMemcpyKind
# A run's host time, in order: requests unpacked into the pinned slots, the graph launched (or the
# ops enqueued), the wait for the GPU (copies in, kernels, copies out), the outputs read from the
# pinned slots (fp16 -> fp32 where the plan is fp16). `runs` and `phase_ns` add them up per model.
PHASES = ("stage", "launch", "wait", "fetch")
CUBLAS_WORKSPACE_BYTES = 32 << 20  # cuBLAS's scratch, handed to it so a captured GEMM allocates nothing
NVRTC_OPTIONS = ("-std=c++17", "--use_fast_math")
W4A16_FATBIN = "w4a16.fatbin"  # the compiler's build_w4a16: a half plan's INT4 kernels
FP16_MAX = 65504.0  # the largest finite fp16


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def load_module(artifact_dir: Path, device_id: int) -> Any:
    """The artifact's kernels as a cupy.RawModule for this device's arch (counted as a module load)."""
    import cupy as cp

    with cp.cuda.Device(device_id) as dev:
        arch = f"sm_{dev.compute_capability}"
    cubin = artifact_dir / f"kernels.{arch}.cubin"
    fatbin = artifact_dir / "kernels.fatbin"
    source = artifact_dir / "kernels.cu"
    with cp.cuda.Device(device_id):
        if cubin.is_file():
            mod = cp.RawModule(path=str(cubin))
        elif fatbin.is_file():
            mod = cp.RawModule(path=str(fatbin))
        elif source.is_file():
            mod = cp.RawModule(code=source.read_text(), options=NVRTC_OPTIONS)
        else:
            names = f"{cubin.name}, {fatbin.name} or {source.name}"
            raise FileNotFoundError(f"{artifact_dir}: no kernels ({names})")
        counter.module_loaded()
    return mod


class GpuPlanModel(PlanIO):
    platform = "anvil_plan_cuda"

    def __init__(
        self,
        plan: LoadedPlan,
        weights: dict[str, np.ndarray],
        module: Any,
        device_id: int = 0,
        name: str | None = None,
        *,
        graphs: bool = True,
        nan_fill: bool = False,
        gemm: str = "cublas",
        tf32: bool = True,
        outputs: Sequence[str] | None = None,
        precision: str = "auto",
        w4a16_module: Any = None,
        lt_epilogue: bool = False,
        sync: str = "spin",
        pdl: bool = False,
    ) -> None:
        """``precision``: "auto" (what the compiler recorded in the plan), "fp16", "bf16" or "fp32".
        ``sync``: how the host waits for a batch: "spin" on the stream (CUDA's default with fewer
        contexts than cores: the waiting thread keeps its core busy), "block" on a blocking-sync
        event (the thread gives its core back while the GPU runs).
        ``w4a16_module``: the artifact's W4A16 kernels (a half plan's INT4 linears); None: those run
        cuBLAS in the half type on weights dequantized here. ``lt_epilogue``: a half plan's linears
        with a bias and no residual or LayerNorm run on cuBLASLt with the bias (+ ReLU / tanh-GELU)
        fused. ``pdl``: the INT4 linears' GEMV-like kernels launch as programmatic dependents where
        ``w4a16_module``'s kernels wait for their predecessor (anvil_kernels.cuda.pdl)."""
        import cupy as cp

        t0 = time.perf_counter()
        p = plan.plan
        self._init_io(plan, name, outputs)  # only these outputs are copied to the host
        self.device_id = device_id
        counter.install()
        self._cp = cp
        if gemm not in ("cublas", "plan"):
            raise ValueError(f"gemm must be 'cublas' or 'plan', got {gemm!r}")
        if sync not in ("block", "spin"):
            raise ValueError(f"sync must be 'block' or 'spin', got {sync!r}")
        if precision == "auto" and gemm == "plan":
            precision = "fp32"  # the compiler's kernels are the fp32 plan's
        self.precision = resolve_precision(precision, p)
        half = self.precision in HALF
        if half and gemm != "cublas":
            raise ValueError(
                f"an {self.precision} plan runs its linears on cuBLAS / W4A16: gemm must be 'cublas'"
            )
        self._dtypes = (
            device_dtypes(p, self.precision) if half else [plan.dtype(i) for i in range(len(p.tensors))]
        )
        self._kernels: dict[int, str] | None = half_kernels(p, self.precision) if half else None
        lin16 = (
            F16Linears(p, self.max_batch, self.max_seq, w4a16_module is not None, self.precision)
            if half
            else None
        )
        self._lin16 = lin16
        steps = gemm_ops(p) if gemm == "cublas" and not half else []
        self._gemm: dict[int, GemmStep] = {st.op_index: st for st in steps}
        host = self._host_weights(p, weights)
        layout = lin16.layout(host) if lin16 is not None else None
        self._woffs = lin16.weight_offsets(len(host)) if lin16 is not None else None
        f32_tmp = max((st.rows(p, self.max_batch, self.max_seq) * st.n * 4 for st in steps), default=0)
        tmp_bytes = _align(max(f32_tmp, lin16.tmp_bytes if lin16 is not None else 0))
        weight_bytes = int(p.weightBytes) if layout is None else layout.nbytes
        banks = {"weights": weight_bytes, "activations": int(p.activationBytes)}
        if steps or lin16:  # cuBLAS's (or W4A16's) output before the epilogue, then cuBLAS's workspace
            banks["staging"] = tmp_bytes + CUBLAS_WORKSPACE_BYTES
        with cp.cuda.Device(device_id):
            self.arena = DeviceArena(banks, device_id, what=f"model {self.spec.name!r}")
            self._epilogue: Any = None
            if steps:
                self._epilogue = self._epilogue_kernel()
            elif lin16:
                self._epilogue = self._epilogue_f16_kernel()
            if layout is None:
                for wi, arr in zip(p.weights, host, strict=True):
                    self.arena.write("weights", int(wi.offset), arr)
            else:
                for key, arr in layout.arrays.items():
                    self.arena.write("weights", layout.offsets[key], arr)
            if nan_fill:
                self.arena.fill("activations", 0xFF)
            self.stream = cp.cuda.Stream(non_blocking=True)
            # recorded after each batch and waited on; None: the stream is waited on (spinning)
            self._done = cp.cuda.Event(block=True, disable_timing=True) if sync == "block" else None
            self._blas: Gemm | None = None
            if steps or lin16:
                ws = self.arena.ptr("staging", tmp_bytes)
                self._blas = Gemm(self.stream.ptr, ws, CUBLAS_WORKSPACE_BYTES, tf32, self.precision)
            if lin16 is not None:
                lt = None
                if lt_epilogue and any(lin.lt_epilogue is not None for lin in lin16.lins.values()):
                    lt = LtGemm(self.stream.ptr, ws, CUBLAS_WORKSPACE_BYTES, self.precision)  # same stream
                arch = f"sm_{cp.cuda.Device(device_id).compute_capability}"
                lin16.bind(self.arena, self._blas, self._epilogue, w4a16_module, lt, arch, pdl=pdl)
                cp.cuda.Device(device_id).synchronize()  # W4A16Linear uploads on the legacy stream
            self._fns = self._functions(module, p, self._kernels)
            self._slots, pinned_bytes = self._layout_pinned()
            self.pinned = PinnedBank(pinned_bytes)
            # (name, b, t) -> its slot as an array: made once per bucket (a shape from the plan's
            # dimension expressions, a view, a reshape: ~5 µs each, three or more per batch)
            self._views: dict[tuple[str, int, int], np.ndarray] = {}
            # Buckets: pad T only where a mask marks the padding; otherwise T is run as it comes.
            self.pad_seq = bool(self.mask_inputs) or not self.seq_inputs
            self.buckets = Buckets.for_plan(self.max_batch, self.max_seq if self.pad_seq else 1)
            self._act, self._wts = self.arena.ptr("activations"), self.arena.ptr("weights")
            self._graphs: dict[tuple[int, int], Any] = {}
            self.graph_error = ""
            if graphs:
                self._capture_all()
            self.stream.synchronize()
        self.load_s = time.perf_counter() - t0
        self.padded_cells = 0  # (row, token) cells run, padding included
        self.used_cells = 0  # of those, cells that carried a request's data
        self.runs = 0  # chunks run (one graph launch, or one eager enqueue, each)
        self.phase_ns = [0] * len(PHASES)  # per PHASES: host ns spent there over those runs
        log.info(
            "model on the GPU",
            extra={
                "model": self.spec.name,
                "device": f"cuda:{device_id}",
                "weights_mib": round(self.weight_bytes / 2**20, 2),
                "activations_mib": round(int(p.activationBytes) / 2**20, 2),
                "pinned_mib": round(pinned_bytes / 2**20, 2),
                "graphs": len(self._graphs),
                "graph_error": self.graph_error,
                "precision": self.precision,
                "linears": self.linear_report(),
                "load_s": round(self.load_s, 3),
            },
        )

    @classmethod
    def load(
        cls,
        artifact_dir: str | Path,
        device_id: int = 0,
        name: str | None = None,
        *,
        gemm: str = "cublas",
        tf32: bool = True,
        outputs: Sequence[str] | None = None,
        precision: str = "auto",
        lt_epilogue: bool = False,
        sync: str = "spin",
        pdl: bool = False,
    ) -> GpuPlanModel:
        from safetensors.numpy import load_file

        root = Path(artifact_dir)
        plan = load_plan(root / "plan.bin")
        weights = load_file(str(root / "weights.safetensors"))
        module = load_module(root, device_id)
        w4a16 = None
        if resolve_precision(precision, plan.plan) in HALF and (root / W4A16_FATBIN).is_file():
            import cupy as cp

            from anvil_kernels.cuda import load_module as load_w4a16

            with cp.cuda.Device(device_id):
                w4a16 = load_w4a16(root / W4A16_FATBIN)
            counter.module_loaded()
        return cls(
            plan, weights, module, device_id, name,
            gemm=gemm, tf32=tf32, outputs=outputs, precision=precision, w4a16_module=w4a16,
            lt_epilogue=lt_epilogue, sync=sync, pdl=pdl,
        )  # fmt: skip

    # ---- load --------------------------------------------------------------------------------
    _epilogue_module: Any = None  # one per process: compiled once, shared by every model

    @staticmethod
    def _host_weights(p: Any, weights: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The plan's weights by index, in the plan's dtypes and shapes (checked)."""
        out: list[np.ndarray] = []
        for wi in p.weights:
            key = _s(wi.name)
            arr: np.ndarray = np.ascontiguousarray(weights[key], dtype=DTYPES[wi.dtype])
            shape = tuple(int(d) for d in _l(wi.shape))
            if arr.shape != shape:
                raise ValueError(f"weight {key!r}: shape {arr.shape}, plan says {shape}")
            out.append(arr)
        return out

    def linear_report(self) -> list[dict[str, Any]]:
        """Per linear: its backend and which kernel runs it at each batch bucket's row count."""
        p = self.plan.plan
        out: list[dict[str, Any]] = []
        if self.precision == "fp32":
            for i, op in enumerate(p.ops):
                if _s(op.kind) == "linear":
                    out.append({"op": _s(op.name), "kernel": "cublas_tf32" if i in self._gemm else "plan"})
            return out
        assert self._lin16 is not None
        return self._lin16.report(self.buckets.all())

    _epilogue_f16_module: Any = None

    def _epilogue_f16_kernel(self) -> dict[str, Any]:
        cp = self._cp
        if GpuPlanModel._epilogue_f16_module is None:
            GpuPlanModel._epilogue_f16_module = cp.RawModule(code=EPILOGUE_F16_SOURCE, options=NVRTC_OPTIONS)
            counter.module_loaded()
        return {n: GpuPlanModel._epilogue_f16_module.get_function(n) for n in EPILOGUE_KERNELS}

    def _epilogue_kernel(self) -> dict[str, Any]:
        cp = self._cp
        if GpuPlanModel._epilogue_module is None:
            GpuPlanModel._epilogue_module = cp.RawModule(code=EPILOGUE_SOURCE, options=NVRTC_OPTIONS)
            counter.module_loaded()
        names = ("anvil_gemm_epilogue", "anvil_gemm_epilogue_v4", "anvil_gemm_epilogue_ln_warp")
        return {n: GpuPlanModel._epilogue_module.get_function(n) for n in names}

    @staticmethod
    def _functions(module: Any, p: Any, kernels: dict[int, str] | None) -> dict[str, Any]:
        fns: dict[str, Any] = {}
        for i, op in enumerate(p.ops):
            if kernels is not None and _s(op.kind) == "linear":
                continue  # an fp16 plan's linears run on cuBLAS / W4A16
            kernel = _s(op.kernel) if kernels is None else kernels[i]
            if kernel not in fns:
                fns[kernel] = module.get_function(kernel)
            if int(op.smemBytes or 0) > 48 * 1024:
                fns[kernel].max_dynamic_shared_size_bytes = int(op.smemBytes)
        return fns

    def _layout_pinned(self) -> tuple[dict[str, tuple[int, int]], int]:
        """name -> (pinned offset, tensor index) for every public input and output."""
        slots: dict[str, tuple[int, int]] = {}
        off = 0
        for name, tensor, _, _ in (*self.inputs, *self.outputs):
            slots[name] = (off, tensor)
            off += _align(int(self.plan.plan.tensors[tensor].maxBytes))
        return slots, off

    def _capture_all(self) -> None:
        cp = self._cp
        for b, t in self.buckets.all():
            try:
                with self.stream:
                    self.stream.begin_capture()
                    try:
                        self._enqueue(b, t)
                    finally:
                        graph = self.stream.end_capture()
                self._graphs[(b, t)] = graph
            except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError, RuntimeError) as exc:
                # Graphs are an optimisation: without them every batch launches its kernels one by one.
                self.graph_error = f"graph capture at {b}x{t} failed: {exc}"
                self._graphs.clear()
                return

    # ---- run ---------------------------------------------------------------------------------
    def check_request(self, inputs: RequestInputs) -> None:
        """PlanIO's checks, and in an fp16 plan a float input whose finite values fp16 cannot hold
        (|x| > 65,504) is refused with the value and the remedy instead of turning into inf and a
        wrong answer (bf16 and fp32 plans hold fp32's range)."""
        super().check_request(inputs)
        if self.precision != "fp16":
            return
        for name, tensor, _, _ in self.inputs:
            a = inputs.get(name)
            if a is None or self._dtypes[tensor] != np.float16 or not np.issubdtype(a.dtype, np.floating):
                continue
            mags = np.abs(a)
            if not mags.size or mags.max() <= FP16_MAX:  # the common case: one pass, no masking
                continue
            finite = mags[np.isfinite(mags)]  # inf / NaN are the client's own values, passed through
            peak = float(finite.max()) if finite.size else 0.0
            if peak > FP16_MAX:
                raise SpecError(
                    f"input {name!r}: a value of magnitude {peak:.4g} exceeds fp16's range (65,504) of "
                    "this fp16 plan; deploy the model with --gpu-precision bf16 or fp32"
                )

    def _pinned(self, name: str, b: int, t: int) -> np.ndarray:
        """The pinned slot of input or output ``name`` at bucket (b, t): the same array every call."""
        view = self._views.get((name, b, t))
        if view is None:
            off, tensor = self._slots[name]
            view = self.pinned.view(off, self.plan.shape(tensor, b, t), self._dtypes[tensor])
            self._views[(name, b, t)] = view
        return view

    def _enqueue(self, b: int, t: int) -> None:
        """Copies in, every kernel, copies out, on the model's stream (the caller made it current)."""
        self._copy_in(b, t)
        for i, launch in enumerate(self._launches(b, t)):
            self._run_op(i, launch, b, t)
        cp, s = self._cp, self.stream.ptr
        for name, tensor, _, _ in self.outputs:
            off = self._slots[name][0]
            n = self._pinned(name, b, t).nbytes
            src = self._act + int(self.plan.plan.tensors[tensor].offset)
            cp.cuda.runtime.memcpyAsync(self.pinned.base + off, src, n, D2H, s)

    def _copy_in(self, b: int, t: int) -> None:
        cp, s = self._cp, self.stream.ptr
        for name, tensor, _, _ in self.inputs:
            off = self._slots[name][0]
            n = self._pinned(name, b, t).nbytes
            dst = self._act + int(self.plan.plan.tensors[tensor].offset)
            cp.cuda.runtime.memcpyAsync(dst, self.pinned.base + off, n, H2D, s)

    def _run_op(self, i: int, launch: Launch, b: int, t: int) -> None:
        """Enqueue op ``i``: its kernel, or cuBLAS / W4A16 and an epilogue for a linear."""
        step = self._gemm.get(i)
        if self._lin16 is not None and i in self._lin16:
            self._lin16.run(i, b, t)
        elif step is None:
            self._fns[launch.kernel](launch.grid, launch.block, launch.args, shared_mem=launch.smem)
        else:
            self._run_gemm(step, b, t)

    def _run_gemm(self, step: GemmStep, b: int, t: int) -> None:
        """x @ W on cuBLAS into the workspace, then the op's epilogue into its output."""
        p = self.plan.plan
        m = step.rows(p, b, t)
        x = self._act + int(p.tensors[step.x].offset)
        w = self._wts + int(p.weights[step.weight].offset)
        tmp = self.arena.ptr("staging")
        assert self._blas is not None  # made at load whenever a GemmStep exists
        self._blas(x, w, tmp, m, step.n, step.k)  # TF32 tensor cores unless tf32=False
        kernel, grid, block, smem, args = epilogue_launch(step, p, self._act, self._wts, tmp, m)
        self._epilogue[kernel](grid, block, args, shared_mem=smem)

    def _launches(self, b: int, t: int) -> list[Launch]:
        p = self.plan.plan
        skip = self._lin16.lins if self._lin16 is not None else ()
        return resolve_launches(p, self._act, self._wts, b, t, self._woffs, self._kernels, skip)

    def _run_chunk(self, reqs: list[RequestInputs], lens: list[int], t: int) -> dict[str, np.ndarray]:
        t0 = time.perf_counter_ns()
        bb, bt = self._stage(reqs, lens, t)
        with self._cp.cuda.Device(self.device_id), self.stream:
            t1 = time.perf_counter_ns()
            graph = self._graphs.get((bb, bt))
            if graph is not None:
                graph.launch(self.stream)
            else:
                self._enqueue(bb, bt)
            t2 = time.perf_counter_ns()
            if self._done is not None:
                self._done.record(self.stream)
                self._done.synchronize()
            else:
                self.stream.synchronize()
        t3 = time.perf_counter_ns()
        # a half plan's fp16 / bf16 outputs go back to the spec's fp32 here (a pooled output is fp32 already)
        out = {name: to_f32(self._pinned(name, bb, bt)) for name, _, _, _ in self.outputs}
        ph = self.phase_ns
        ph[0] += t1 - t0
        ph[1] += t2 - t1
        ph[2] += t3 - t2
        ph[3] += time.perf_counter_ns() - t3
        self.runs += 1
        return out

    def _stage(self, reqs: list[RequestInputs], lens: list[int], t: int) -> tuple[int, int]:
        """The chunk's bucket; every request's rows unpacked into the pinned input slots at its shape."""
        rows = sum(self._rows(r) for r in reqs)
        bb, bt = self.buckets.pick(rows, t if self.pad_seq else 1)
        if not self.pad_seq:
            bt = t  # no mask: run the exact length (eager launches)
        for name, _, _, _ in self.inputs:
            dst = self._pinned(name, bb, bt)
            dst[...] = 0
            row = 0
            for r, n in zip(reqs, lens, strict=True):
                a = r[name]
                if dst.dtype == BF16:  # a bf16 plan's float input: its bits (numpy has no bfloat16)
                    a = to_half(a, "bf16")
                k = a.shape[0]
                if name in self.seq_inputs:
                    dst[row : row + k, :n] = a
                else:
                    dst[row : row + k] = a
                row += k
        self.padded_cells += bb * bt
        self.used_cells += sum(self._rows(r) * n for r, n in zip(reqs, lens, strict=True))
        return bb, bt

    @property
    def weight_bytes(self) -> int:
        """Device bytes of the weights: the arena's weight bank, plus W4A16's prepacked INT4 weights."""
        extra = self._lin16.w4a16_bytes if self._lin16 is not None else 0
        return self.arena.bank_bytes("weights") + extra

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    def reset_padding(self) -> None:
        """Padding and the runs' phase times are reported for served batches, not warm-up."""
        self.padded_cells = self.used_cells = 0
        self.runs = 0
        self.phase_ns = [0] * len(PHASES)

    @property
    def padding_waste(self) -> float:
        """Share of the (row, token) cells run so far that were padding."""
        return 1.0 - self.used_cells / self.padded_cells if self.padded_cells else 0.0
