"""CuPy launcher of the W4A16 kernels and the compiler seam.

Compiler seam: ``OPS`` maps an op id to the function that runs it on the GPU. Today one op:
    OPS["int4_linear"] = int4_linear_cuda(x, layer, out, bias=None, residual=None)
where ``layer`` is a ``W4A16Linear`` built once per weight at load time (its activation is fixed
at construction, as the CPU op's ``activation`` argument is per call site). x, out, bias and
residual are CuPy arrays (uint16 holding bf16 bits, or float16), C-contiguous, x 16-byte aligned;
out is written in full and must not alias an input. Nothing is allocated per call.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.cuda import tmap
from anvil_kernels.cuda.pdl import default_launcher
from anvil_kernels.cuda.w4a16 import (
    _DT_CODE,
    FLAG_EVICT_FIRST,
    FLAG_LATE_TRIGGER,
    FLAG_SCALE_BF16,
    SCALE_BF16,
    ActDType,
    LaunchPlan,
    Variant,
    default_gd,
    plan_gv,
    plan_launch,
)
from anvil_kernels.cuda.w4a16_dispatch import GEMV, GEMV_LIKE, DispatchTable, KernelChoice, choose
from anvil_kernels.cuda.w4a16_gv import GV_CONFIGS, gv_kernel_name
from anvil_kernels.cuda.w4a16_mtc import (
    MTC_CONFIGS,
    TILE_X_KERNEL,
    TILE_X_THREADS,
    mtc_from_prepack,
    mtc_kernel_name,
    plan_mtc,
    tile_x_rows,
)
from anvil_kernels.cuda.w4a16_tc import TcPlan, plan_tc, tc_kernel_name


class ModuleSet:
    """Several cupy.RawModules (``build_fatbins``' units) behind one ``get_function``."""

    def __init__(self, modules: Sequence[Any]) -> None:
        self._modules = list(modules)

    def get_function(self, name: str) -> Any:
        return self.module_of(name).get_function(name)

    def module_of(self, name: str) -> Any:
        """The unit that holds kernel ``name`` (its globals are that unit's own)."""
        for mod in self._modules:
            try:
                mod.get_function(name)
            except Exception:  # cupy raises its driver error for a name the unit lacks
                continue
            return mod
        raise KeyError(f"no kernel {name!r} in any of {len(self._modules)} modules")


PDL_MARKER = "w4a16_pdl_marker"  # a kernel of every module whose GEMV-like kernels wait (w4a16.cu)
# likewise for the wgs kernels and w4a16_tile_x (w4a16_wgs.cu), which wait since a later commit
WGS_PDL_MARKER = "w4a16_wgs_pdl_marker"
PDL_MARKERS = (PDL_MARKER, WGS_PDL_MARKER)  # empty kernels, no tile of any family


def waits_for_predecessor(module: Any, marker: str = PDL_MARKER) -> bool:
    """Whether ``module``'s GEMV-like kernels (``marker`` WGS_PDL_MARKER: its wgs kernels and
    w4a16_tile_x) execute griddepcontrol.wait before they read x (built from a source with
    ``pdl_wait``: the marker kernel is there), so they may be launched as programmatic dependents.
    False for a module built before (an older artifact's fatbin)."""
    try:
        module.get_function(marker)
    except Exception:  # KeyError from a ModuleSet, the driver's NOT_FOUND from a RawModule
        return False
    return True


def load_module(path: str | Path | Sequence[str | Path]) -> Any:
    """A cupy.RawModule from a fatbin/cubin built by ``build_fatbin``, or a ``ModuleSet`` over the
    list ``build_fatbins`` returns (also: one string of paths joined by os.pathsep)."""
    import cupy

    if isinstance(path, str) and os.pathsep in path:
        path = path.split(os.pathsep)
    if isinstance(path, (str, Path)):
        return cupy.RawModule(path=str(path))
    return ModuleSet([cupy.RawModule(path=str(p)) for p in path])


X_MAPS_KEPT = 16  # x tensor maps a layer keeps (one per x buffer and M a plan launches it with)


def _ptr(a: Any) -> np.uint64:
    return np.uint64(0 if a is None else a.data.ptr)


@dataclass(frozen=True)
class _Launch:
    choice: KernelChoice
    plan: LaunchPlan | TcPlan
    fn: Any
    xt_rows: int = 0  # a wgs kernel: rows of x retiled by w4a16_tile_x before it (0: x as it is)
    tx: bool = False  # a tx wgs kernel: x through a tensor map (tmap.py), no w4a16_tile_x


class W4A16Linear:
    """One INT4 linear layer on the GPU: weights uploaded once, kernels looked up once.

    ``module``: a cupy.RawModule holding the kernels this layer needs (``build_fatbin`` with the
    default params holds all). ``packed``: ``prepack(w)`` (the GEMV/tc layout), optionally with
    ``prepack_mtc(w)``'s arrays added (``mq``, ``msz``); each layout is uploaded only if a kernel
    that reads it runs for some M <= m_max (the mtc one is derived from ``prepack``'s on the host
    when absent). The host arrays are dropped after construction unless ``keep_host`` (then
    ``set_kernel`` may later pick a kernel of the other layout: tuning and benchmarks).
    ``m_max``: the largest M a call may pass. Per M the kernel comes from
    ``w4a16_dispatch.choose`` (``table``: measured choices) or, for tuning and tests, from
    ``kernel``/``split``/``overrides`` (``set_kernel``). The split-K workspace (fp32) and tile
    counters are sized at construction for every M up to m_max, so steady-state calls allocate
    nothing and only launch. With split-K the tensor-core kernels use those counters: one layer
    must not run on two streams at once. Results are deterministic (split partials are added in a
    fixed order). ``pdl``: the GEMV-like kernels (M up to ~16-32) are launched with programmatic
    stream serialization (``pdl.PdlLauncher``): each may start while the kernel before it on the
    stream drains, streams its first weights, and waits (``griddepcontrol.wait``) before it reads x;
    so are the wgs tiles and the x retiling before them where the module's build waits there too
    (``WGS_PDL_MARKER``); every other tile launches as before. ``late_trigger``: a wgs tile's producer
    lets the next kernel be scheduled only after its own wait, not before it (``FLAG_LATE_TRIGGER``:
    at most two wgs launches in flight; before it, a chain of tx tiles, which have no
    ``w4a16_tile_x`` between them, can run two layers ahead); ``None`` (the default): late for the
    tx tiles, where it was measured faster as dependents (docs/kernels_gpu.md), early for the
    others. ``launcher``: a stand-in for the PDL launcher (tests).
    """

    def __init__(
        self,
        module: Any,
        packed: Mapping[str, np.ndarray],
        m_max: int,
        *,
        dtype: ActDType = "bf16",
        activation: str = "none",
        sm_count: int | None = None,
        overrides: Mapping[str, int] | None = None,
        table: DispatchTable | None = None,
        kernel: str | None = None,
        split: int | None = None,
        keep_host: bool = False,
        pdl: bool = False,
        late_trigger: bool | None = None,
        launcher: Any = None,
    ) -> None:
        import cupy

        if dtype not in _DT_CODE:
            raise ValueError(f"dtype must be one of {tuple(_DT_CODE)}, got {dtype!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        if m_max < 1:
            raise ValueError(f"m_max must be >= 1, got {m_max}")
        self.k, self.n, self.group_size, kind = (int(v) for v in packed["meta"])
        self.dtype: ActDType = dtype
        self.activation = activation
        self.m_max = m_max
        self._act = ACTIVATIONS[activation]
        self._scale_flag = FLAG_SCALE_BF16 if kind == SCALE_BF16 else 0
        self._packed: Mapping[str, np.ndarray] | None = packed
        self.qweight: Any = None  # GEMV / tc layout, uploaded when a kernel that reads it is chosen
        self.sz: Any = None
        self.mq: Any = None  # mtc layout, likewise
        self.msz: Any = None
        self._module = module
        if sm_count is None:
            sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self._sm_count = sm_count
        self._table = table
        self._ws = cupy.zeros(1, np.float32)
        self._counters = cupy.zeros(1, np.int32)
        self._xt = cupy.zeros(8, self.xdtype)  # x retiled for the wgs kernels, grown by set_kernel
        self._tile_x: Any = None
        self._x_maps: dict[tuple[int, int, int], Any] = {}  # tx kernels: x's tensor maps, oldest first
        self._launches: dict[int, _Launch] = {}
        # programmatic dependent launch of the GEMV-like kernels (pdl.py), only of kernels that wait
        if pdl and not waits_for_predecessor(module):
            raise ValueError(
                "pdl=True needs kernels that wait for the kernel before them; this module was built "
                f"from a w4a16.cu without them (no {PDL_MARKER})"
            )
        self.pdl = pdl
        self.late_trigger = late_trigger
        self._wgs_waits = waits_for_predecessor(module, WGS_PDL_MARKER)  # else wgs launches stay plain
        self._pdl_launch: Any = launcher
        self.set_kernel(kernel, split, overrides)
        if not keep_host:
            self._packed = None

    def with_activation(self, activation: str) -> W4A16Linear:
        """This layer with ``activation`` fused instead: ``self`` when it already is, else a layer
        over the same uploaded weights, workspace and kernel choice (the activation is a launch
        argument), for a plan whose linears share a weight but not their activation. Its launch
        cache is its own; the two must run one after the other (one stream), as a plan's linears do."""
        if activation == self.activation:
            return self
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        twin = copy.copy(self)
        twin.activation, twin._act = activation, ACTIVATIONS[activation]
        twin._launches = dict(self._launches)
        twin._overrides = dict(self._overrides)
        return twin

    @property
    def device_bytes(self) -> int:
        """Bytes of the weights uploaded to the device (every layout this layer uploaded)."""
        return sum(int(a.nbytes) for a in (self.qweight, self.sz, self.mq, self.msz) if a is not None)

    def set_kernel(
        self, kernel: str | None = None, split: int | None = None, overrides: Mapping[str, int] | None = None
    ) -> None:
        """Force one kernel ("gemv", a GV_CONFIGS, a TC_CONFIGS or an MTC_CONFIGS name) and split, or a
        GEMV-like kernel with a launch geometry (overrides: mt, ns, sn, sk; ns only for "gemv"; no
        kernel: "gemv"), for every M; all None: back to the dispatcher (tuning and tests).
        Regrows the workspace where needed; a CUDA graph captured before must be captured again."""
        import cupy

        if split is not None and kernel is None:
            raise ValueError("split needs a tc kernel")
        self._overrides = dict(overrides or {})
        if self._overrides and kernel not in (None, *GEMV_LIKE):
            raise ValueError("overrides (mt, ns, sn, sk) are the GEMV-like kernels' geometry")
        if self._overrides and kernel is None:
            kernel = GEMV
        self._force = None if kernel is None else KernelChoice(kernel, split, source="forced")
        self._launches.clear()
        ws, tiles, xt = 1, 1, 0
        mtc = old = False
        for m in range(1, self.m_max + 1):
            ch = self.choice(m)
            plan = self._plan(m, ch)
            mtc, old = mtc or ch.kernel in MTC_CONFIGS, old or ch.kernel not in MTC_CONFIGS
            if isinstance(plan, TcPlan):
                ws, tiles = max(ws, plan.ws_floats), max(tiles, plan.tiles)
            if ch.kernel in MTC_CONFIGS:
                xt = max(xt, tile_x_rows(m, ch.kernel) * self.k)
        packed = self._packed
        if packed is None and ((old and self.qweight is None) or (mtc and self.mq is None)):
            raise ValueError("this kernel reads a weight layout not uploaded: construct with keep_host=True")
        if old and self.qweight is None and packed is not None:
            self.qweight = cupy.asarray(packed["qweight"])
            self.sz = cupy.asarray(packed["sz"])
        if mtc and self.mq is None and packed is not None:
            arrays = mtc_from_prepack(packed)
            self.mq = cupy.asarray(arrays["mq"])
            self.msz = cupy.asarray(arrays["msz"])
        if ws > self._ws.size:
            self._ws = cupy.zeros(ws, np.float32)
        if tiles > self._counters.size:
            self._counters = cupy.zeros(tiles, np.int32)
        if xt > self._xt.size:
            self._xt = cupy.zeros(xt, self.xdtype)
        if xt and self._tile_x is None:
            self._tile_x = self._module.get_function(TILE_X_KERNEL)
        self._make(1)  # fail early if the module lacks this layer's kernels
        self._make(self.m_max)

    def choice(self, m: int) -> KernelChoice:
        """The kernel that runs M = m (what a plan records: ``choice(m).as_dict()``)."""
        if self._force is not None:
            return self._force
        return choose(m, self.n, self.k, self.group_size, self._table)

    def _plan(self, m: int, ch: KernelChoice) -> LaunchPlan | TcPlan:
        if ch.kernel == GEMV:
            ov = self._overrides
            return plan_launch(m, self.n, self.k, self.group_size, sm_count=self._sm_count, **ov)
        if ch.kernel in GV_CONFIGS:
            return plan_gv(
                m, self.n, self.k, self.group_size, ch.kernel, sm_count=self._sm_count, **self._overrides
            )
        if ch.kernel in MTC_CONFIGS:
            g, sms = self.group_size, self._sm_count
            return plan_mtc(m, self.n, self.k, g, ch.kernel, sm_count=sms, split=ch.split)
        return plan_tc(m, self.n, self.k, self.group_size, ch.kernel, sm_count=self._sm_count, split=ch.split)

    @property
    def xdtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.dtype == "bf16" else np.dtype(np.float16)

    def _make(self, m: int) -> _Launch:
        """Plan and kernel for M = m, made on the first call with that M and kept."""
        hit = self._launches.get(m)
        if hit is not None:
            return hit
        ch = self.choice(m)
        plan = self._plan(m, ch)
        cpg = self.group_size // 64
        if isinstance(plan, LaunchPlan) and plan.kernel in GV_CONFIGS:
            name = gv_kernel_name(self.dtype, plan.kernel, plan.mt, cpg)
        elif isinstance(plan, LaunchPlan):
            name = Variant(self.dtype, plan.mt, plan.ns, cpg, default_gd(plan.mt, plan.ns, cpg)).name
        elif plan.cfg in MTC_CONFIGS:
            name = mtc_kernel_name(self.dtype, plan.cfg, cpg)
        else:
            name = tc_kernel_name(self.dtype, plan.cfg, cpg)
        fn = self._module.get_function(name)
        # the opt-in is the kernel's (shared by every layer and M), and a gv kernel's shared memory
        # grows with its plan's split-K: only ever raise it
        if plan.smem > 48 * 1024 and int(fn.max_dynamic_shared_size_bytes) < plan.smem:
            fn.max_dynamic_shared_size_bytes = plan.smem
        mtc = plan.cfg if isinstance(plan, TcPlan) and plan.cfg in MTC_CONFIGS else None
        xt_rows = tile_x_rows(m, mtc) if mtc else 0
        launch = _Launch(ch, plan, fn, xt_rows, mtc is not None and MTC_CONFIGS[mtc].tx)
        self._launches[m] = launch
        return launch

    def plan(self, m: int) -> LaunchPlan | TcPlan:
        return self._make(m).plan

    def __call__(self, x: Any, out: Any, bias: Any = None, residual: Any = None) -> Any:
        """out = act(x @ W + bias) + residual; x (M, K), out/residual (M, N), bias (N,). Returns out."""
        m = int(x.shape[0])
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ValueError(f"x must have shape (M, K={self.k}), got {tuple(x.shape)}")
        if not 1 <= m <= self.m_max:
            raise ValueError(f"M={m} must be in [1, m_max={self.m_max}]")
        if tuple(out.shape) != (m, self.n):
            raise ValueError(f"out must have shape ({m}, {self.n}), got {tuple(out.shape)}")
        for name, a in (("x", x), ("out", out), ("bias", bias), ("residual", residual)):
            if a is None:
                continue
            if a.dtype != self.xdtype:
                raise ValueError(f"{name} must have dtype {self.xdtype} ({self.dtype}), got {a.dtype}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous")
        if int(x.data.ptr) % 16 != 0:
            raise ValueError("x must be 16-byte aligned (the kernels read it in 16-byte pieces)")
        if bias is not None and tuple(bias.shape) != (self.n,):
            raise ValueError(f"bias must have shape ({self.n},), got {tuple(bias.shape)}")
        if residual is not None and tuple(residual.shape) != (m, self.n):
            raise ValueError(f"residual must have shape ({m}, {self.n}), got {tuple(residual.shape)}")
        launch = self._make(m)
        plan = launch.plan
        dims = (np.int32(m), np.int32(self.n), np.int32(self.k))
        if isinstance(plan, LaunchPlan):
            flags = self._scale_flag | (FLAG_EVICT_FIRST if plan.evict_first else 0)
            args: tuple[Any, ...] = (
                self.qweight, self.sz, x, out, _ptr(bias), _ptr(residual), *dims,
                np.int32(plan.sn), np.int32(plan.sk), np.int32(self._act), np.int32(flags),
            )  # fmt: skip
            # the GEMV-like kernels wait (griddepcontrol.wait) before they read x
            self._launch(self.pdl, launch.fn, plan.grid, (plan.block,), args, plan.smem)
        else:
            # the mtc kernels take no L2 policy: their copies with an evict_first cache hint
            # (cp.async ... L2::cache_hint) raised an illegal instruction on the H200
            wq, wsz = (self.mq, self.msz) if plan.cfg in MTC_CONFIGS else (self.qweight, self.sz)
            xs = x
            # a wgs kernel and its x retiling wait for the kernel before them (where built so)
            dependent = self.pdl and self._wgs_waits and (bool(launch.xt_rows) or launch.tx)
            if launch.xt_rows:  # a wgs kernel reads x retiled, rows past M zero
                pieces = launch.xt_rows * (self.k // 8)
                grid = (-(-pieces // TILE_X_THREADS),)
                targs = (x, self._xt, np.int32(m), np.int32(launch.xt_rows), np.int32(self.k))
                self._launch(dependent, self._tile_x, grid, (TILE_X_THREADS,), targs)
                xs = self._xt
            late = launch.tx if self.late_trigger is None else self.late_trigger
            args = (
                wq, wsz, xs, out, _ptr(bias), _ptr(residual), self._ws, self._counters,
                *dims, np.int32(self._act), np.int32(self._scale_flag | (FLAG_LATE_TRIGGER if late else 0)),
            )  # fmt: skip
            if launch.tx:  # the kernel's last parameter: x's tensor map, by value (CuPy's pointer
                # to its bytes for a plain launch, the map itself for the PDL launcher)
                xm = self._x_map(x, m, MTC_CONFIGS[plan.cfg].bm)
                args += (xm if dependent else xm.param(),)
            self._launch(dependent, launch.fn, plan.grid, (plan.block,), args, plan.smem)
        return out

    def _x_map(self, x: Any, m: int, box_rows: int) -> Any:
        """x's tensor map for a tx kernel (tmap.encode_x), kept for the last few (pointer, M)
        (a plan's buffers are fixed: one encoding each, then none per call)."""
        key = (int(x.data.ptr), m, box_rows)
        xm = self._x_maps.pop(key, None)
        if xm is None:
            xm = tmap.encode_x(key[0], m, self.k, box_rows)
        self._x_maps[key] = xm  # the most recent last
        while len(self._x_maps) > X_MAPS_KEPT:
            del self._x_maps[next(iter(self._x_maps))]
        return xm

    def _launch(
        self, dependent: bool, fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0
    ) -> None:
        """One kernel launch: as a programmatic dependent of the kernel before it (the PDL launcher),
        or plainly."""
        if dependent:
            (self._pdl_launch or default_launcher())(fn, grid, block, args, shared_mem=shared_mem)
        else:
            fn(grid, block, args, shared_mem=shared_mem)


def int4_linear_cuda(x: Any, layer: W4A16Linear, out: Any, bias: Any = None, residual: Any = None) -> Any:
    """The compiler's seam for op id ``int4_linear`` on a GPU (see the module docstring)."""
    return layer(x, out, bias=bias, residual=residual)


OPS: dict[str, Callable[..., Any]] = {"int4_linear": int4_linear_cuda}
