"""Fresh random inputs on every run; the seed is printed so a failure can be replayed. Also the
stand-in cupy and kernels that let the CPU tests drive ``W4A16Linear`` through the numpy models of
the tensor-core kernels (``fake_cupy``, ``model_module``)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from anvil_kernels.cuda.w4a16_linear import PDL_MARKERS

PTXAS_ENTRY = re.compile(
    r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads\s*ptxas info\s*: Used (\d+) registers",
    re.S,
)


@pytest.fixture
def ptxas_registers() -> Callable[[str], dict[str, int]]:
    """A reader of `nvcc -Xptxas -v` output: kernel name -> registers, failing on any kernel with a
    stack frame or spills (the ptxas tests of the tc, mtc and gv kernels)."""

    def read(stderr: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, stack, st, ld, regs in PTXAS_ENTRY.findall(stderr):
            assert (int(stack), int(st), int(ld)) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
            if name not in PDL_MARKERS:  # the empty kernels every module carries: no tile of any family
                out[name] = int(regs)
        return out

    return read


@pytest.fixture(scope="session")
def cuobjdump() -> str | None:
    """The SASS dumper for the ptxas tests' SASS checks: cuobjdump on PATH, else the one of NVIDIA's
    pip wheel ``nvidia-cuda-cuobjdump`` (what .ci/run installs), else None (the checks skip)."""
    found = shutil.which("cuobjdump")
    if found is not None:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's pip wheels
    except ImportError:
        return None
    for root in nvidia.__path__:
        for cand in sorted(Path(root).glob("cu*/bin/cuobjdump")):
            return str(cand)
    return None


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(os.environ.get("ANVIL_TEST_SEED", np.random.SeedSequence().entropy % (2**63)))
    print(f"ANVIL_TEST_SEED={seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def module() -> object:
    """The W4A16 kernels: ``ANVIL_W4A16_FATBIN`` (prebuilt fatbins, os.pathsep-separated, e.g. by
    bench/w4a16_device.sh), else every variant built once per session with nvcc (in parallel)."""
    pytest.importorskip("cupy")
    from anvil_kernels.cuda import GV_CONFIGS, MTC_CONFIGS, W4A16Params, build_fatbins, load_module

    env = os.environ.get("ANVIL_W4A16_FATBIN")
    params = W4A16Params(mtc_configs=tuple(MTC_CONFIGS), gv_configs=tuple(GV_CONFIGS))
    # sm_90a: the wg kernels' wgmma exists only there (an H100/H200 runs sm_90a code)
    return load_module(env if env else build_fatbins(params, ("compute_90a,code=sm_90a",)))


class DevArray(np.ndarray):
    """A host array posing as a CuPy one: ``.data.ptr`` (registered, so a kernel stand-in can
    find an array from the pointer the launcher passes)."""

    registry: ClassVar[dict[int, np.ndarray]] = {}

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        ptr = 4096 * (1 + id(self) % (1 << 40))
        DevArray.registry[ptr] = self
        return SimpleNamespace(ptr=ptr)


def _dev(a: np.ndarray) -> DevArray:
    return np.ascontiguousarray(a).view(DevArray)


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Callable[[np.ndarray], DevArray]:
    """Installs a stand-in ``cupy`` (asarray, zeros on host arrays); returns the host -> "device"
    array function."""
    fake = SimpleNamespace(
        asarray=lambda a, dtype=None: _dev(np.asarray(a, dtype=dtype)),
        zeros=lambda shape, dtype=None: _dev(np.zeros(shape, dtype=dtype)),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)

    # x's tensor map for the tx tiles: what the map describes, for the kernel stand-in to check
    # (passed as itself where the real one passes CuPy's pointer to its bytes)
    def fake_map(ptr: int, m: int, k: int, box_rows: int) -> SimpleNamespace:
        xm = SimpleNamespace(ptr=ptr, m=m, k=k, box_rows=box_rows)
        xm.param = lambda: xm
        return xm

    monkeypatch.setattr("anvil_kernels.cuda.tmap.encode_x", fake_map)
    return _dev


class ModelKernel:
    """Stands in for one compiled tc or mtc kernel: checks the launch (block, shared memory and
    its opt-in, grid, workspace, counters), runs the kernel's numpy model (``tc_model`` or
    ``mtc_model``) on the arguments in the kernel's order, then the epilogue (bias, activation,
    residual, rounding)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.max_dynamic_shared_size_bytes = 0

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0
    ) -> None:
        from anvil_kernels.activations import activate
        from anvil_kernels.cuda import mtc_model, tc_model
        from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS
        from anvil_kernels.cuda.w4a16_tc import TC_CONFIGS
        from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

        if self.name == "w4a16_tile_x":  # mtc_model.tile_x, on the 16-bit values as they are
            x, xt, m, mpad, k = args
            assert block == (256,) and grid == (-(-int(mpad) * int(k) // 8 // 256),)
            tiled = mtc_model.tile_x(np.asarray(x, np.float64).reshape(int(m), int(k)), int(mpad))
            xt.reshape(-1)[: tiled.size] = tiled.astype(xt.dtype)
            return
        hit = re.match(r"w4a16((?:m?tc|wgs?)\w+?)_(bf16|fp16)_c(\d)$", self.name)
        assert hit is not None, self.name
        cfg, dt, cpg = hit.group(1), hit.group(2), int(hit.group(3))
        mtc = cfg in MTC_CONFIGS
        c = MTC_CONFIGS[cfg] if mtc else TC_CONFIGS[cfg]
        if mtc and MTC_CONFIGS[cfg].tx:  # x as it is, and its tensor map (boxes of BM rows) last
            *args, xmap = args
        qw, sz, x, y, bias, res, ws, counters, m, n, k, act, flags = args
        assert block == (c.threads,) and shared_mem == c.smem
        xt = None
        if mtc and MTC_CONFIGS[cfg].tx:
            assert (xmap.ptr, xmap.m, xmap.k, xmap.box_rows) == (x.data.ptr, int(m), int(k), c.bm), xmap
            assert x.size == int(m) * int(k)
        elif mtc and MTC_CONFIGS[cfg].ws:  # x arrives retiled (w4a16_tile_x), whole tiles of rows
            mpad = int(grid[0]) * c.bm
            xt = np.asarray(x).reshape(-1)[: mpad * int(k)].copy()
            x = mtc_model.untile_x(xt, int(m), int(k), mpad).astype(xt.dtype)
        assert shared_mem <= 48 * 1024 or self.max_dynamic_shared_size_bytes >= shared_mem
        assert tuple(grid[:2]) == (-(-int(m) // c.bm), -(-int(n) // c.bn))
        # split-K through the workspace (a wgs cluster's split-K, kc, sums on chip: no workspace)
        on_chip = mtc and c.kc == grid[2]
        assert grid[2] == 1 or on_chip or ws.size >= grid[0] * grid[1] * grid[2] * c.bm * c.bn
        assert counters.size >= grid[0] * grid[1] and not counters.any()

        def f64(a: np.ndarray) -> np.ndarray:
            return bf16_bits_to_f32(a).astype(np.float64) if dt == "bf16" else a.astype(np.float64)

        meta = np.array([int(k), int(n), 64 * cpg, int(flags) & 1], np.int64)
        if mtc:
            packed = {"mq": qw, "msz": sz, "meta": meta}
            xt64 = None if xt is None else f64(xt)
            out, writes = mtc_model.simulate(packed, f64(x), cfg, int(grid[2]), dt, xt=xt64)
        else:
            packed = {"qweight": qw, "sz": sz, "meta": meta}
            out, writes = tc_model.simulate(packed, f64(x), cfg, int(grid[2]), dt)
        assert np.array_equal(writes, np.ones_like(writes))
        v = out + (f64(DevArray.registry[int(bias)]) if int(bias) else 0.0)
        v = np.vectorize(lambda t: activate(t, int(act)))(v)
        if int(res):
            v = v + f64(DevArray.registry[int(res)])
        y[...] = f32_to_bf16_bits(v.astype(np.float32)) if dt == "bf16" else v.astype(np.float16)


@pytest.fixture
def model_module() -> SimpleNamespace:
    """A stand-in for the compiled module whose kernels are the numpy models (``ModelKernel``)."""
    return SimpleNamespace(get_function=ModelKernel)
