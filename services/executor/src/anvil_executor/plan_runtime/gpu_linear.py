"""The linears of a half GPU plan (precision "fp16" or "bf16", docs/executor_gpu.md): which backend runs
each one at each row count, the weights each backend reads, and the half epilogue. Below for fp16; a
bf16 plan is the same in bf16 (gpu_backend cublas_bf16, w4a16_bf16, cublas_bf16_dequant; bf16 weights,
cuBLAS and W4A16 in bf16, the epilogue's bf16 kernels).

    fp32 weights  (gpu_backend cublas_f16)   tmp (M, N) fp16 = x (M, K) fp16 @ W16 (K, N)   cuBLAS,
                                                                                      fp32 accumulation
    INT4 weights  (gpu_backend w4a16)        M <= w4a16_max_m: the W4A16 kernel (GEMV-like, or a
                                             tensor-core tile in an sm_90 plan) the plan's measured
                                             rows name for this arch and M (``w4a16_kernels``; else
                                             the dispatcher's rule, up to 16 rows),
                                             anvil_kernels.cuda.W4A16Linear on the prepacked INT4
                                             weights, bias + activation + residual fused when there
                                             is no LayerNorm; above: cuBLAS on W16 = the weights
                                             dequantized at load
    INT4 weights  (cublas_f16_dequant)       cuBLAS on W16 for every M (the W4A16 kernels cannot take
                                             this layer, or the artifact has no w4a16.fatbin)
    then          out = LN?(act(tmp + bias) + residual)  fp16 in and out, fp32 arithmetic
                                             (epilogue_f16.cu; same semantics as ops.linear)

The backend comes from the plan (op attrs written by the compiler's codegen/gpu_backend.py,
anvil_core.plan_format.HALF_LINEAR_BACKENDS); the row
counts of the shape buckets pick the kernel per bucket, and ``choices`` records it. Nothing here needs
a GPU but ``W4A16Linear`` (made by the runtime); the host-side planning is tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anvil_core.logs import get_logger
from anvil_core.plan_format import ACT_CODES, HALF_LINEAR_BACKENDS
from anvil_executor.plan_runtime.cublas_linear import GemmStep
from anvil_executor.plan_runtime.cublaslt_raw import LT_EPILOGUES
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import _s, attrs_of
from anvil_executor.plan_runtime.precision import LINEAR_KINDS, WeightLayout, half_dtype, to_half
from anvil_kernels import Int4Weight, dequantize
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.cuda import PLAN_COMMON
from anvil_kernels.cuda.w4a16 import ActDType
from anvil_kernels.cuda.w4a16_dispatch import RULE_GEMV_ROWS, Row, parse_rows, table_from_rows
from anvil_kernels.cuda.w4a16_linear import waits_for_predecessor

__all__ = [
    "EPILOGUE_F16_SOURCE",
    "EPILOGUE_KERNELS",
    "EPILOGUE_PREFIX",
    "F16Linears",
    "LinearF16",
    "epilogue_f16_launch",
    "f16_linears",
    "linear_bias16",
    "linear_weights",
]

EPILOGUE_F16_SOURCE = PLAN_COMMON.read_text() + Path(__file__).with_name("epilogue_f16.cu").read_text()
LN_WARP_MAX_N = 64 * 8  # ANVIL_F16_LN_PAIRS pairs per lane
EPILOGUE_PREFIX = {"fp16": "anvil_f16", "bf16": "anvil_bf16"}  # epilogue_f16.cu's kernels per precision
EPILOGUE_KERNELS = tuple(
    f"{prefix}{suffix}"
    for prefix in EPILOGUE_PREFIX.values()
    for suffix in ("_epilogue", "_epilogue_v8", "_epilogue_ln_warp")
)
THREADS = 256
MAX_BLOCKS = 132 * 16  # a few waves of the H200's SMs; the grid-stride loop covers the rest
log = get_logger("anvil.executor.gpu_linear")


@dataclass(frozen=True, slots=True)
class LinearF16:
    """One linear of a half (fp16 or bf16) plan. ``backend``: the plan's name for what runs it (its
    ``kind``, "cublas", "w4a16" or "dequant", and ``precision`` follow from it); ``step``: tensors,
    weights and epilogue (its ``weight`` is the fp32 weight's index, or -1 for INT4); ``int4``: the
    (packed, scales, zeros) weight indices."""

    step: GemmStep
    backend: str
    w4a16_max_m: int  # rows up to which the W4A16 kernel runs; 0: never
    act_name: str
    group: int = 0
    int4: tuple[int, int, int] | None = None
    max_rows: int = 0  # rows at (max_batch, max_seq)
    # the measured W4A16 kernel per M, per arch (attr w4a16_kernels: arch -> ((M, kernel, split), ...))
    w4a16_rows: tuple[tuple[str, tuple[Row, ...]], ...] = ()
    fused: bool = field(init=False)  # W4A16 applies bias + activation + residual itself (no LayerNorm)
    precision: str = field(init=False)  # "fp16" or "bf16", from the backend's name
    kind: str = field(init=False)  # "cublas", "w4a16" or "dequant", from the backend's name

    def __post_init__(self) -> None:
        object.__setattr__(self, "fused", self.step.gamma < 0 and self.act_name in ACTIVATIONS)
        if self.backend not in LINEAR_KINDS:
            raise ValueError(f"gpu_backend {self.backend!r} is not one of {sorted(LINEAR_KINDS)}")
        precision, kind = LINEAR_KINDS[self.backend]
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "kind", kind)

    @property
    def plain(self) -> bool:
        """x @ W alone (no bias, activation, residual or LayerNorm): cuBLAS writes the output itself."""
        st = self.step
        return st.bias < 0 and self.act_name == "none" and st.residual < 0 and st.gamma < 0

    @property
    def lt_epilogue(self) -> int | None:
        """The cuBLASLt epilogue that does this linear's bias (+ activation), or None (residual,
        LayerNorm, no bias, or an activation cuBLASLt does not have)."""
        st = self.step
        if st.bias < 0 or st.residual >= 0 or st.gamma >= 0:
            return None
        return LT_EPILOGUES.get(self.act_name)

    def uses_w4a16(self, m: int) -> bool:
        return self.kind == "w4a16" and m <= self.w4a16_max_m

    @property
    def needs_dense(self) -> bool:
        """Whether some row count runs cuBLAS, so the half (K, N) weight must be on the device."""
        return self.kind != "w4a16" or self.max_rows > self.w4a16_max_m

    def kernel_at(self, m: int, lt: bool = False, w4a16: str = "gemv") -> str:
        """What runs M = m rows (``F16Linears.report``); ``lt``: cuBLASLt epilogues are on; ``w4a16``:
        the W4A16 kernel its layer chose for M (``W4A16Linear.choice``)."""
        if self.uses_w4a16(m):
            return f"w4a16_{w4a16}" + ("" if self.fused else "+epilogue")
        tag = "f16" if self.precision == "fp16" else self.precision
        if self.plain:
            return f"cublas_{tag}"
        if lt and self.lt_epilogue is not None:
            return f"cublaslt_{tag}_bias"
        return f"cublas_{tag}+epilogue"


def f16_linears(
    plan: Any, max_batch: int, max_seq: int, w4a16_available: bool, precision: str = "fp16"
) -> dict[int, LinearF16]:
    """op index -> LinearF16 for every linear of ``plan``; ValueError on a linear the plan gave no
    backend of ``precision`` (a plan compiled before GPU precisions existed, for fp32, or for the
    other half precision)."""
    out: dict[int, LinearF16] = {}
    for i, op in enumerate(plan.ops):
        if _s(op.kind) != "linear":
            continue
        attrs = attrs_of(op)
        backend = str(attrs.get("gpu_backend", ""))
        prec, kind = LINEAR_KINDS.get(backend, ("", ""))
        if prec != precision:
            names = sorted(b for b, (pr, _) in LINEAR_KINDS.items() if pr == precision)
            raise ValueError(f"op {_s(op.name)!r}: gpu_backend {backend!r} is not one of {names}")
        w = {_s(r): int(ix) for r, ix in zip(_l(op.weightRoles), _l(op.weights), strict=True)}
        ins = {_s(r): int(ix) for r, ix in zip(_l(op.inputRoles), _l(op.inputs), strict=True)}
        int4 = (w["packed"], w["scales"], w["zeros"]) if "packed" in w else None
        if int4 is not None:
            k2, n = (int(d) for d in _l(plan.weights[int4[0]].shape))
            k = 2 * k2
        else:
            k, n = (int(d) for d in _l(plan.weights[w["weight"]].shape))
        if kind == "w4a16" and not w4a16_available:
            kind = "dequant"  # no w4a16.fatbin in the artifact (the load log says why)
            backend = HALF_LINEAR_BACKENDS[precision][kind]
        act = str(attrs.get("act", "none"))
        try:
            rows = parse_rows(str(attrs.get("w4a16_kernels", ""))) if kind == "w4a16" else {}
            max_m = int(attrs.get("w4a16_max_m", 0)) if kind == "w4a16" else 0
            if max_m < 0:
                raise ValueError(f"w4a16_max_m must be >= 0, got {max_m}")
        except ValueError as exc:
            raise ValueError(f"op {_s(op.name)!r}: {exc}") from None
        ln = "gamma" in w
        step = GemmStep(
            op_index=i,
            x=ins["x"],
            out=int(_l(op.outputs)[0]),
            residual=ins.get("residual", -1),
            weight=w.get("weight", -1),
            bias=w.get("bias", -1),
            gamma=w["gamma"] if ln else -1,
            beta=w.get("beta", -1) if ln else -1,
            k=k,
            n=n,
            act=ACT_CODES[act],
            eps=float(attrs.get("eps", 0.0)) if ln else 0.0,
        )
        out[i] = LinearF16(
            step=step,
            backend=backend,
            w4a16_max_m=max_m,
            act_name=act,
            group=int(attrs.get("group", 0)),
            int4=int4,
            max_rows=step.rows(plan, max_batch, max_seq),
            w4a16_rows=tuple(sorted(rows.items())),
        )
    return out


def _missing_kernel() -> tuple[type[BaseException], ...]:
    """What looking up a kernel a module lacks raises: KeyError from anvil_kernels' ModuleSet, the
    driver's CUDA_ERROR_NOT_FOUND from a cupy.RawModule."""
    try:
        from cupy_backends.cuda.api.driver import CUDADriverError
    except ImportError:  # no CuPy: only the ModuleSet's
        return (KeyError,)
    return (KeyError, CUDADriverError)


def _int4(plan: Any, weights: list[np.ndarray], lin: LinearF16) -> Int4Weight:
    assert lin.int4 is not None
    packed, scales, zeros = (weights[ix] for ix in lin.int4)
    return Int4Weight(packed, scales, zeros, lin.group, lin.step.k, lin.step.n, "fp16")


def linear_weights(
    plan: Any, weights: list[np.ndarray], lin: LinearF16
) -> tuple[np.ndarray | None, dict[str, np.ndarray] | None]:
    """(W16 (K, N) in the plan's half type for cuBLAS or None, W4A16 prepacked arrays or None) of one
    linear; ``weights`` by plan weight index (host arrays)."""
    if lin.int4 is None:
        return to_half(weights[lin.step.weight], lin.precision), None
    q = _int4(plan, weights, lin)
    dense = to_half(dequantize(q), lin.precision) if lin.needs_dense else None
    prepacked = None
    if lin.kind == "w4a16":
        from anvil_kernels.cuda import prepack

        prepacked = prepack(q)
    return dense, prepacked


def linear_bias16(weights: list[np.ndarray], lin: LinearF16) -> np.ndarray | None:
    """The half bias of a linear whose bias the W4A16 kernel or cuBLASLt fuses (in the output's
    dtype), else None."""
    if lin.fused and lin.step.bias >= 0:
        return to_half(weights[lin.step.bias], lin.precision)
    return None


Addr = Callable[[int], int]  # tensor or weight index -> device address (0 for -1)


def epilogue_f16_launch(
    step: GemmStep, act_addr: Addr, wt_addr: Addr, tmp: int, m: int, precision: str = "fp16"
) -> tuple[str, tuple[int, int, int], tuple[int, int, int], int, tuple[Any, ...]]:
    """(kernel, grid, block, shared memory bytes, args) of the half epilogue of ``m`` rows (the
    ``anvil_f16_*`` kernels for fp16, ``anvil_bf16_*`` for bf16: same launch): a warp per row for
    LayerNorm rows of at most LN_WARP_MAX_N (even) values, 8 values per thread without LayerNorm when
    N % 8 == 0 and the pointers are 16-byte aligned, else a block per row."""
    prefix = EPILOGUE_PREFIX[precision]
    bias, res, out = (
        np.uint64(wt_addr(step.bias)),
        np.uint64(act_addr(step.residual)),
        np.uint64(act_addr(step.out)),
    )
    ln = step.gamma >= 0
    if ln and step.n <= LN_WARP_MAX_N and step.n % 2 == 0:
        warps = THREADS // 32
        args: tuple[Any, ...] = (
            np.uint64(tmp), bias, res, np.uint64(wt_addr(step.gamma)), np.uint64(wt_addr(step.beta)), out,
            np.int64(m), np.int32(step.n), np.int32(step.act), np.float32(step.eps),
        )  # fmt: skip
        return f"{prefix}_epilogue_ln_warp", (-(-m // warps), 1, 1), (THREADS, 1, 1), 0, args
    aligned = all(int(p) % 16 == 0 for p in (tmp, bias, res, out))
    if not ln and step.n % 8 == 0 and aligned:
        octs = m * step.n // 8
        blocks = max(1, min(MAX_BLOCKS, -(-octs // THREADS)))
        args = (np.uint64(tmp), bias, res, out, np.int64(octs), np.int32(step.n // 8), np.int32(step.act))
        return f"{prefix}_epilogue_v8", (blocks, 1, 1), (THREADS, 1, 1), 0, args
    threads = min(1024, max(32, -(-step.n // 32) * 32))
    args = (
        np.uint64(tmp), bias, res, np.uint64(wt_addr(step.gamma)), np.uint64(wt_addr(step.beta)), out,
        np.int32(step.n), np.int32(step.act), np.int32(int(ln)), np.float32(step.eps),
    )  # fmt: skip
    return f"{prefix}_epilogue", (m, 1, 1), (threads, 1, 1), (4 * step.n if ln else 0), args


class F16Linears:
    """The linears of one half (fp16 or bf16) plan on one device. The runtime (GpuPlanModel) calls, in order:
    ``layout`` (host: where each weight goes in the weight bank), ``bind`` (after the arena, stream,
    cuBLAS handle and epilogue kernels exist: uploads the W4A16 weights), then ``run`` per linear op
    while it enqueues a bucket (eager or under graph capture). It owns the W4A16Linear layers."""

    def __init__(
        self, plan: Any, max_batch: int, max_seq: int, w4a16_available: bool, precision: str = "fp16"
    ) -> None:
        self.plan = plan
        self.precision = precision
        self._np = half_dtype(precision)  # host / CuPy dtype of the half values (BF16: uint16 bits)
        self.lins = f16_linears(plan, max_batch, max_seq, w4a16_available, precision)
        self.layers: dict[int, Any] = {}
        self.pdl = False  # W4A16 layers launched as programmatic dependents (bind)
        self._prepacked: dict[int, dict[str, np.ndarray]] = {}
        self._keys: dict[Any, int] = {}
        self._lt: Any = None
        self.shares: dict[int, int] = {}  # op index -> the linear whose weights it reads (layout)

    def __contains__(self, op_index: int) -> bool:
        return op_index in self.lins

    def __bool__(self) -> bool:
        return bool(self.lins)

    @property
    def tmp_bytes(self) -> int:
        """The fp16 (M, N) buffer between a GEMM and its epilogue, at the largest M."""
        return max((lin.max_rows * lin.step.n * 2 for lin in self.lins.values()), default=0)

    def layout(self, host: list[np.ndarray]) -> WeightLayout:
        """The weight bank: every weight but the linears' (K, N) / INT4 ones as the plan has it, then
        per linear its fp16 (K, N) weight where cuBLAS runs it and the fp16 bias of a fused W4A16
        epilogue. ``host``: the plan's weights by index.

        Linears that read the same plan weight (the compiler stores a shared initializer once) share
        its fp16 copy and W4A16 prepack: the first such linear makes them, the others alias it
        (``shares``), so the weights are converted, prepacked and uploaded once."""
        layout = WeightLayout()
        replaced: set[int] = set()
        for lin in self.lins.values():
            replaced |= {lin.step.weight} if lin.int4 is None else set(lin.int4)
        for i, arr in enumerate(host):
            if i not in replaced:
                layout.add(("w", i), arr)
        first: dict[tuple[Any, ...], int] = {}
        for i, lin in self.lins.items():
            src = (lin.step.weight, lin.int4, lin.kind, lin.needs_dense, lin.max_rows, lin.w4a16_max_m)
            owner = first.setdefault(src, i)
            if owner != i:
                self.shares[i] = owner
            dense, packed = linear_weights(self.plan, host, lin) if owner == i else (None, None)
            bias16 = linear_bias16(host, lin)
            if dense is not None:
                layout.add(("w16", i), dense)
            if bias16 is not None:
                layout.add(("b16", i), bias16)
            if packed is not None:
                self._prepacked[i] = packed
        self._keys = dict(layout.offsets)
        for i, owner in self.shares.items():
            if ("w16", owner) in self._keys:
                self._keys[("w16", i)] = self._keys[("w16", owner)]
        return layout

    def bind(
        self,
        arena: Any,
        blas: Any,
        epilogue: dict[str, Any],
        w4a16_module: Any,
        lt: Any = None,
        arch: str = "",
        *,
        pdl: bool = False,
    ) -> None:
        """The device side: the arena (banks weights, activations, staging), the fp16 cuBLAS GEMM, the
        epilogue kernels by name, one W4A16Linear per INT4 linear the W4A16 kernels run (the plan's
        measured kernel per M for ``arch``, e.g. "sm_90", where it recorded one), and ``lt``
        (cublaslt_raw.LtGemm or None): cuBLASLt for the linears whose epilogue it can fuse. ``pdl``:
        the W4A16 layers launch their GEMV-like kernels as programmatic dependents, where the module's
        kernels wait for their predecessor (an older artifact's do not: then they launch plainly)."""
        self._arena, self._blas, self._epilogue, self._lt = arena, blas, epilogue, lt
        if self._prepacked:
            if pdl and not waits_for_predecessor(w4a16_module):
                log.info("w4a16: this artifact's kernels predate PDL; they launch plainly")
                pdl = False
            self.pdl = pdl
            for i, packed in self._prepacked.items():
                self.layers[i] = self._w4a16_layer(self.lins[i], packed, w4a16_module, arch, pdl)
            for i, owner in self.shares.items():
                if owner in self.layers:
                    lin = self.lins[i]
                    act = lin.act_name if lin.fused else "none"
                    self.layers[i] = self.layers[owner].with_activation(act)
        self._prepacked = {}  # uploaded: the host copies can go

    @staticmethod
    def _w4a16_layer(
        lin: LinearF16, packed: dict[str, np.ndarray], module: Any, arch: str, pdl: bool = False
    ) -> Any:
        """The W4A16Linear of one INT4 linear: the kernels its measured rows name for ``arch``, else
        (no rows for this arch, or the module lacks one of them: an artifact built for an older arch
        too) the dispatcher's rule, which the module always holds up to its GEMV-like rows (16). A
        plan that runs W4A16 past those rows (tensor-core tiles: an sm_90 plan) on an arch without
        rows, or with a module that lacks its tiles, is refused here (ValueError): the rule's tiles
        are not in the module, and no dense weights were uploaded for those rows."""
        from anvil_kernels.cuda import W4A16Linear

        m_max = max(1, min(lin.w4a16_max_m, lin.max_rows))
        act = lin.act_name if lin.fused else "none"
        dtype: ActDType = "bf16" if lin.precision == "bf16" else "fp16"  # LINEAR_KINDS: one or the other
        rows = dict(lin.w4a16_rows).get(arch)
        why = f"no measured rows for {arch}"
        if rows:
            table = table_from_rows(arch, {(lin.step.k, lin.step.n): rows})
            try:
                layer = W4A16Linear(module, packed, m_max, dtype=dtype, activation=act, table=table, pdl=pdl)
                for m in range(1, m_max + 1):  # every M the plan runs: each kernel looked up now
                    layer.plan(m)
                return layer
            except _missing_kernel() as exc:
                why = f"w4a16.fatbin lacks a kernel its rows name ({exc})"
        if m_max > RULE_GEMV_ROWS:  # the rule names tiles there, which an artifact holds only by its rows
            raise ValueError(
                f"linear {lin.step.k}x{lin.step.n}: the plan runs the W4A16 kernels up to {m_max} rows "
                f"but {why} on this {arch or 'GPU'}: recompile the model for this GPU's arch"
            )
        if rows:
            log.warning(
                "w4a16: the plan's measured kernels are not all in w4a16.fatbin; the rule runs",
                extra={"arch": arch, "k": lin.step.k, "n": lin.step.n, "err": why},
            )
        return W4A16Linear(module, packed, m_max, dtype=dtype, activation=act, pdl=pdl)

    def w4a16_kernel(self, op_index: int, m: int) -> str | None:
        """The W4A16 kernel that runs linear ``op_index`` at M = m (after ``bind``), else None."""
        lin, layer = self.lins.get(op_index), self.layers.get(op_index)
        if lin is None or layer is None or not lin.uses_w4a16(m):
            return None
        return str(layer.choice(m).kernel)

    def _t(self, ix: int) -> int:
        return 0 if ix < 0 else self._arena.ptr("activations", int(self.plan.tensors[ix].offset))

    def _w(self, ix: int) -> int:
        return 0 if ix < 0 else self._arena.ptr("weights", self._keys[("w", ix)])

    def _view(self, ix: int, rows: int, cols: int) -> Any:
        off = int(self.plan.tensors[ix].offset)
        return self._arena.view("activations", off, (rows, cols), self._np)

    def run(self, op_index: int, b: int, t: int) -> None:
        """Enqueue linear ``op_index`` at (b, t) on the current stream (the runtime's)."""
        lin = self.lins[op_index]
        st = lin.step
        m = st.rows(self.plan, b, t)
        tmp = self._arena.ptr("staging")
        if lin.uses_w4a16(m):
            x = self._view(st.x, m, st.k)
            if lin.fused:
                res = None if st.residual < 0 else self._view(st.residual, m, st.n)
                key = ("b16", op_index)
                bias = (
                    self._arena.view("weights", self._keys[key], (st.n,), self._np)
                    if key in self._keys
                    else None
                )
                self.layers[op_index](x, self._view(st.out, m, st.n), bias=bias, residual=res)
                return
            self.layers[op_index](x, self._arena.view("staging", 0, (m, st.n), self._np))
        else:
            w16 = self._arena.ptr("weights", self._keys[("w16", op_index)])
            if lin.plain:  # nothing to add: cuBLAS writes the output
                self._blas(self._t(st.x), w16, self._t(st.out), m, st.n, st.k)
                return
            if self._lt is not None and lin.lt_epilogue is not None:
                bias16 = self._arena.ptr("weights", self._keys[("b16", op_index)])
                if self._lt.supports(m, st.n, st.k, bias16, lin.lt_epilogue):
                    self._lt(self._t(st.x), w16, self._t(st.out), m, st.n, st.k, bias16, lin.lt_epilogue)
                    return
            self._blas(self._t(st.x), w16, tmp, m, st.n, st.k)  # fp16 tensor cores, fp32 accumulation
        kernel, grid, block, smem, args = epilogue_f16_launch(st, self._t, self._w, tmp, m, self.precision)
        self._epilogue[kernel](grid, block, args, shared_mem=smem)

    @property
    def w4a16_bytes(self) -> int:
        """Device bytes of the W4A16 layers' prepacked weights, every layout a layer uploaded (the
        GEMV-like kernels' and, where the plan runs tiles, the tiles'), outside the arena's weight
        bank; a shared weight once."""
        layers = {(id(layer.qweight), id(layer.mq)): layer for layer in self.layers.values()}
        return sum(int(layer.device_bytes) for layer in layers.values())

    def weight_offsets(self, n_weights: int) -> list[int]:
        """Per plan weight, its offset in the bank ``layout`` made (-1: replaced, not on the device)."""
        return [self._keys.get(("w", i), -1) for i in range(n_weights)]

    def report(self, buckets: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """Per linear: its backend, the row counts (over ``buckets``) each kernel runs, and ``pdl``
        where its W4A16 kernels launch as programmatic dependents."""
        out: list[dict[str, Any]] = []
        for lin in self.lins.values():
            per: dict[str, list[int]] = {}
            for b, t in buckets:
                m = lin.step.rows(self.plan, b, t)
                w4a16 = self.w4a16_kernel(lin.step.op_index, m) or "gemv"
                per.setdefault(lin.kernel_at(m, self._lt is not None, w4a16), []).append(m)
            name = _s(self.plan.ops[lin.step.op_index].name)
            rows = {k: [min(v), max(v)] for k, v in per.items()}
            entry: dict[str, Any] = {"op": name, "backend": lin.backend, "rows": rows}
            if self.pdl and any(k.startswith("w4a16") for k in rows):
                entry["pdl"] = True  # its W4A16 kernels launch as programmatic dependents
            out.append(entry)
        return out
