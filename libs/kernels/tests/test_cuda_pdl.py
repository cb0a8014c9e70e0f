"""Programmatic dependent launch of the GEMV-like W4A16 kernels (``anvil_kernels.cuda.pdl``).

CPU (CI): the ctypes structures match cuda.h's layout (and the header itself, where nvcc's is
installed); ``PdlLauncher`` hands the driver the grid, block, shared memory, the current stream, the
programmatic-serialization attribute and every argument at its width, and raises the driver's
error; ``W4A16Linear(pdl=True)`` sends the GEMV-like kernels and the wgs tiles with their x
retiling (where the module's build waits there too), and nothing else, through it; in the SASS of
every GEMV-like kernel the wait (ACQBULK) comes after the first weight loads or copies and before
any read of x and any store, and in the wgs kernels the producer copies only weights and scale words
before it (x after), the consumers store nothing before theirs, w4a16_tile_x waits before it reads.
GPU: a chain of layers whose every input is the previous layer's output gives the same bits launched
as dependents (eager and inside a CUDA graph) as launched one after the other.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from anvil_kernels.cuda import GV_CONFIGS, MTC_CONFIGS, W4A16Params, prepack
from anvil_kernels.cuda.gpu_check import has_gpu, random_weight
from anvil_kernels.cuda.pdl import (
    PROGRAMMATIC_STREAM_SERIALIZATION,
    LaunchAttribute,
    LaunchConfig,
    PdlLauncher,
)
from anvil_kernels.cuda.w4a16 import FLAG_LATE_TRIGGER, w4a16_source
from anvil_kernels.cuda.w4a16_linear import PDL_MARKER, PDL_MARKERS, WGS_PDL_MARKER
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

# ------------------------------------------------------------------------------------ layout


def test_structures_have_the_driver_layout() -> None:
    """CUlaunchAttribute: id, 4 bytes of padding, a 64-byte union; CUlaunchConfig: 7 unsigned ints,
    then (8-aligned) the stream, the attribute pointer and their count (x86-64)."""
    assert ctypes.sizeof(LaunchAttribute) == 72
    assert LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(LaunchConfig) == 56
    assert LaunchConfig.sharedMemBytes.offset == 24
    assert (LaunchConfig.hStream.offset, LaunchConfig.attrs.offset, LaunchConfig.numAttrs.offset) == (
        32,
        40,
        48,
    )


_LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %d\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
           sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes),
           offsetof(CUlaunchConfig, hStream),
           offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_structures_match_the_installed_header(tmp_path: Path) -> None:
    """The same sizes and offsets, and the attribute's id, as the cuda.h of the installed toolkit
    (a host program built by nvcc, which finds the header)."""
    src = tmp_path / "layout.cu"
    src.write_text(_LAYOUT_C)
    exe = tmp_path / "layout"
    subprocess.run(["nvcc", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    want = [
        ctypes.sizeof(LaunchAttribute),
        LaunchAttribute.value.offset,
        ctypes.sizeof(LaunchConfig),
        LaunchConfig.sharedMemBytes.offset,
        LaunchConfig.hStream.offset,
        LaunchConfig.attrs.offset,
        LaunchConfig.numAttrs.offset,
        PROGRAMMATIC_STREAM_SERIALIZATION,
    ]
    assert [int(v) for v in out.split()] == want


# ------------------------------------------------------------------------------------ launcher


class _DriverError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"CUresult {status}")
        self.status = status


class _FakeDriver:
    """cuLaunchKernelEx's stand-in: decodes what it was handed and returns ``status``."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.calls: list[dict[str, Any]] = []

    def __call__(self, cfg_ptr: Any, fn: ctypes.c_void_p, params: Any, extra: Any) -> int:
        cfg = cfg_ptr.contents
        attr = cfg.attrs[0]
        kinds = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64)
        args = [k.from_address(params[i]).value for i, k in enumerate(kinds)]
        self.calls.append(
            {
                "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                "smem": cfg.sharedMemBytes,
                "stream": cfg.hStream,
                "attr": (cfg.numAttrs, attr.id, attr.value.programmatic),
                "fn": fn.value,
                "args": args,
                "extra": extra,
            }
        )
        return self.status


@pytest.fixture
def stream_cupy(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A stand-in cupy with a current stream and the driver's error type."""
    fake = SimpleNamespace(
        cuda=SimpleNamespace(
            get_current_stream=lambda: SimpleNamespace(ptr=0x5000),
            driver=SimpleNamespace(CUDADriverError=_DriverError),
        )
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_launcher_passes_the_launch_and_the_attribute(stream_cupy: SimpleNamespace) -> None:
    driver = _FakeDriver()
    launch = PdlLauncher(driver)
    arr = SimpleNamespace(data=SimpleNamespace(ptr=0x7000))
    launch(SimpleNamespace(ptr=0x1234), (5, 3), (128,), (arr, None, np.int32(-7), np.uint64(2**40 + 3)), 4096)
    (call,) = driver.calls
    assert call["grid"] == (5, 3, 1) and call["block"] == (128, 1, 1) and call["smem"] == 4096
    assert call["stream"] == 0x5000 and call["fn"] == 0x1234 and call["extra"] is None
    assert call["attr"] == (1, PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    assert call["args"] == [0x7000, None, -7, 2**40 + 3]  # a null pointer reads back as None


def test_launcher_raises_the_driver_error_and_refuses_other_arguments(stream_cupy: SimpleNamespace) -> None:
    launch = PdlLauncher(_FakeDriver(status=700))  # CUDA_ERROR_ILLEGAL_ADDRESS
    fn = SimpleNamespace(ptr=1)
    with pytest.raises(_DriverError) as err:
        launch(fn, (1,), (32,), (None, None, np.int32(0), np.uint64(0)))
    assert err.value.status == 700
    with pytest.raises(TypeError, match=r"np\.int32"):
        PdlLauncher(_FakeDriver())(fn, (1,), (32,), (3,))  # a Python int: its width is not known


def test_w4a16_linear_sends_only_gemv_like_kernels_through_the_launcher(
    fake_cupy: Callable[[np.ndarray], Any], rng: np.random.Generator, model_module: SimpleNamespace
) -> None:
    """pdl=True: a GEMV-like kernel's launch goes to the PDL launcher with the same grid, block,
    arguments and shared memory as a plain launch; a tensor-core tile launches as before."""
    from anvil_kernels.cuda import W4A16Linear

    dev = fake_cupy
    seen: list[tuple[str, tuple, tuple, int]] = []

    def launcher(fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        seen.append((fn.name, tuple(grid), tuple(block), shared_mem))

    class _Named:
        def __init__(self, name: str) -> None:
            self.name = name
            self.max_dynamic_shared_size_bytes = 0

        def __call__(self, *a: Any, **kw: Any) -> None:
            raise AssertionError(f"{self.name} launched without the PDL launcher")

    module = SimpleNamespace(get_function=_Named)
    w = random_weight(rng, 1024, 256, 128, "bf16")
    x = dev(f32_to_bf16_bits(rng.standard_normal((3, 1024)).astype(np.float32)))
    out = dev(np.zeros((3, 256), np.uint16))
    for kernel in ("gemv", *GV_CONFIGS):
        seen.clear()
        layer = W4A16Linear(module, prepack(w), 3, sm_count=132, kernel=kernel, pdl=True, launcher=launcher)
        layer(x, out)
        plan = layer.plan(3)
        assert seen == [(seen[0][0], tuple(plan.grid), (plan.block,), plan.smem)], kernel
    # a tile (the numpy model as the kernel) never goes through the launcher
    tile = W4A16Linear(model_module, prepack(w), 3, sm_count=132, kernel="mtc8", pdl=True, launcher=launcher)
    seen.clear()
    tile(x, out)
    assert seen == []
    assert np.isfinite(bf16_bits_to_f32(np.asarray(out))).all()


def test_w4a16_linear_sends_wgs_tiles_through_the_launcher_where_they_wait(
    fake_cupy: Callable[[np.ndarray], Any], rng: np.random.Generator, model_module: SimpleNamespace
) -> None:
    """pdl=True and a module built with the wgs waits (WGS_PDL_MARKER): w4a16_tile_x (none before a
    tx tile), then the wgs kernel, each through the launcher with a plain launch's grid, block and
    shared memory, and the same output as plain launches; a module built before them launches both
    plainly."""
    from anvil_kernels.cuda import W4A16Linear

    dev = fake_cupy
    w = prepack(random_weight(rng, 512, 256, 128, "bf16"))
    x = dev(f32_to_bf16_bits(rng.standard_normal((37, 512)).astype(np.float32)))
    seen: list[tuple[str, tuple, tuple, int]] = []

    def running(fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        seen.append((fn.name, tuple(grid), tuple(block), shared_mem))
        fn(grid, block, args, shared_mem=shared_mem)  # the numpy model runs as the kernel

    def before_wgs_waits(name: str) -> Any:
        if name == WGS_PDL_MARKER:
            raise KeyError(name)
        return model_module.get_function(name)

    old = SimpleNamespace(get_function=before_wgs_waits)
    wgs = [c for c in MTC_CONFIGS if MTC_CONFIGS[c].ws]
    assert wgs
    for cfg in wgs:
        outs = []
        for mod, pdl in ((model_module, False), (model_module, True), (old, True)):
            seen.clear()
            layer = W4A16Linear(mod, w, 37, sm_count=132, kernel=cfg, pdl=pdl, launcher=running)
            out = dev(np.full((37, 256), 0xFFFF, np.uint16))
            layer(x, out)
            outs.append(np.asarray(out).copy())
            plan = layer.plan(37)
            if pdl and mod is model_module:
                # a tx tile reads x through its tensor map: no w4a16_tile_x before it
                first = [] if MTC_CONFIGS[cfg].tx else ["w4a16_tile_x"]
                assert [s_[0] for s_ in seen][:-1] == first and len(seen) == len(first) + 1, (cfg, seen)
                assert seen[-1][0].startswith(f"w4a16{cfg}_"), (cfg, seen)
                assert seen[-1][1:] == (tuple(plan.grid), (plan.block,), plan.smem), cfg
            else:
                assert seen == [], (cfg, pdl)
        assert np.isfinite(bf16_bits_to_f32(outs[0])).all(), cfg
        assert np.array_equal(outs[1], outs[0]) and np.array_equal(outs[2], outs[0]), cfg


def test_late_trigger_sets_its_flag_on_the_wgs_launches_only(
    fake_cupy: Callable[[np.ndarray], Any], rng: np.random.Generator, model_module: SimpleNamespace
) -> None:
    """late_trigger=True: the wgs kernel's flags argument carries FLAG_LATE_TRIGGER, False: not, None
    (the default): a tx tile's does and no other's; w4a16_tile_x's arguments are the same, and the
    output does not change."""
    from anvil_kernels.cuda import W4A16Linear

    dev = fake_cupy
    w = prepack(random_weight(rng, 512, 256, 128, "bf16"))
    x = dev(f32_to_bf16_bits(rng.standard_normal((37, 512)).astype(np.float32)))
    flags: dict[str, list[int]] = {}

    def running(fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        if fn.name == "w4a16_tile_x":
            assert len(args) == 5, args  # (x, XT, M, rows, K): no flags
        else:  # the wgs or wgd kernel: (W, SZ, X, Y, bias, res, ws, counters, M, N, K, act, flags, ...)
            flags.setdefault(fn.name, []).append(int(args[12]))
        fn(grid, block, args, shared_mem=shared_mem)

    for cfg in (c for c in MTC_CONFIGS if MTC_CONFIGS[c].ws):
        outs = []
        for late in (False, True, None):
            flags.clear()
            layer = W4A16Linear(
                model_module, w, 37, sm_count=132, kernel=cfg, pdl=True, late_trigger=late, launcher=running
            )
            out = dev(np.full((37, 256), 0xFFFF, np.uint16))
            layer(x, out)
            outs.append(np.asarray(out).copy())
            (got,) = flags.values()
            want = MTC_CONFIGS[cfg].tx if late is None else late
            assert [bool(f & FLAG_LATE_TRIGGER) for f in got] == [want], (cfg, late, got)
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2]), cfg


# ------------------------------------------------------------------------------------ SASS


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(600)
def test_gemv_like_kernels_wait_after_the_first_weights_and_before_x(
    tmp_path: Path, cuobjdump: str | None
) -> None:
    """In every GEMV-like kernel (register ring and every gv config, bf16 g128) the SASS issues the
    first weight loads (LDG.E.NA: L1 no-allocate) or copies (LDGSTS, UBLKCP) before the first wait
    (ACQBULK, griddepcontrol.wait) and PREEXIT (launch_dependents), and no x load (LDG without
    NA), shared-memory weight read or store (STG) before that wait."""
    if cuobjdump is None:
        pytest.skip("no cuobjdump")
    params = W4A16Params(dtypes=("bf16",), groups=(128,), tc_configs=(), gv_configs=tuple(GV_CONFIGS))
    names = []
    for name, body in _sass_functions(tmp_path, params, cuobjdump).items():
        if not name.startswith("w4a16") or name in PDL_MARKERS:  # the marker kernels are empty
            continue
        names.append(name)
        ops = _ops(body)
        assert "ACQBULK" in ops and "PREEXIT" in ops, name
        wait = ops.index("ACQBULK")
        before = ops[:wait]
        assert any(o.startswith(("LDG.E.NA", "LDGSTS", "UBLKCP")) for o in before), (
            f"{name}: no weights before the wait"
        )
        assert "PREEXIT" in before, f"{name}: launch_dependents after the wait"
        early = [o for o in before if (o.startswith("LDG.E") and ".NA" not in o) or o.startswith("STG")]
        assert not early, f"{name}: {early} before the wait"
    assert any(re.match(r"w4a16_bf16_m\d", n_) for n_ in names), names  # the register ring
    assert {c for c in GV_CONFIGS if any(n_.startswith(f"w4a16{c}_") for n_ in names)} == set(GV_CONFIGS), (
        names
    )


def _ops(body: str) -> list[str]:
    """The opcodes of one function's SASS, in address order (predicates dropped)."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)


def _sass_functions(tmp_path: Path, params: W4A16Params, cuobjdump: str) -> dict[str, str]:
    """The kernels of ``params`` built for sm_90a: kernel name -> its SASS (cuobjdump)."""
    src = tmp_path / "k.cu"
    src.write_text(w4a16_source(params))
    cubin = tmp_path / "k.cubin"
    cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(cubin), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return {b.split("\n", 1)[0].strip(): b for b in re.split(r"\n\s*Function : ", sass)[1:]}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.timeout(600)
def test_wgs_kernels_copy_only_weights_before_the_wait(tmp_path: Path, cuobjdump: str | None) -> None:
    """The wgs tiles (one producer warp, and a producer warpgroup; and a tx tile) and w4a16_tile_x,
    bf16 g128: the consumers' code loads and stores nothing global before its wait (ACQBULK); the
    producer's bulk copies (UBLKCP) before its wait are two (the prologue's weights and scale words),
    then launch_dependents (PREEXIT) and the wait, in that order or (FLAG_LATE_TRIGGER) the other,
    and the x copies after them (a tx tile's tensor copies, UTMALDG, only there); w4a16_tile_x
    waits before its first load and store, and only then lets its dependent launch (one layer
    ahead at most)."""
    if cuobjdump is None:
        pytest.skip("no cuobjdump")
    cfgs = ("wgs64n", "wgs128w", "wgs64ndt")
    assert all(MTC_CONFIGS[c].ws for c in cfgs)
    params = W4A16Params(dtypes=("bf16",), groups=(128,), tc_configs=(), mtc_configs=cfgs)
    bodies = _sass_functions(tmp_path, params, cuobjdump)
    assert WGS_PDL_MARKER in bodies
    for cfg in cfgs:
        ops = _ops(bodies[f"w4a16{cfg}_bf16_c2"])
        first_wait = ops.index("ACQBULK")
        assert not [o for o in ops[:first_wait] if o.startswith(("LDG", "STG", "UBLKCP"))], cfg
        # the producer's code: from its first bulk copy on
        prod = ops[ops.index("UBLKCP.S.G") :]
        wait = prod.index("ACQBULK")
        assert prod[:wait].count("UBLKCP.S.G") == 2, (cfg, prod[: wait + 1])
        x_copy = "UTMALDG.2D" if MTC_CONFIGS[cfg].tx else "UBLKCP.S.G"
        assert x_copy in prod[wait:], cfg
        # two branches on FLAG_LATE_TRIGGER before the first x copy: launch_dependents, then the
        # wait, and (late) the wait, then launch_dependents
        sync = [o for o in prod[: prod.index(x_copy, wait)] if o in ("ACQBULK", "PREEXIT")]
        assert len(sync) == 4, (cfg, sync)
        orders = sorted([tuple(sync[:2]), tuple(sync[2:])])
        assert orders == [("ACQBULK", "PREEXIT"), ("PREEXIT", "ACQBULK")], (cfg, sync)
        assert "UTMALDG.2D" not in ops[: ops.index("UBLKCP.S.G") + wait], cfg  # no x before the wait
    tx = _ops(bodies["w4a16_tile_x"])
    wait = tx.index("ACQBULK")
    assert "PREEXIT" in tx[wait:] and "PREEXIT" not in tx[:wait], tx  # its wgs kernel launches after
    assert not [o for o in tx[:wait] if o.startswith(("LDG", "STG"))], tx
    assert any(o.startswith("LDG") for o in tx[wait:]) and any(o.startswith("STG") for o in tx[wait:])


# ------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA device (or no cupy)")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gemv", *GV_CONFIGS])
@pytest.mark.parametrize("m", [1, 5])
def test_dependent_chain_gives_the_same_bits(
    module: object, rng: np.random.Generator, kernel: str, m: int
) -> None:
    """Twelve layers, each reading the buffer the previous one wrote and writing the one it read
    (read-after-write and write-after-read between neighbours), launched as programmatic dependents
    eagerly and as a captured CUDA graph, against the same chain launched plainly with a
    synchronize after each layer: the same bits, and finite."""
    _chain_same_bits(module, rng, kernel, m)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [c for c in MTC_CONFIGS if MTC_CONFIGS[c].ws])
@pytest.mark.parametrize("m", [37, 64])
def test_dependent_wgs_chain_gives_the_same_bits(
    module: object, rng: np.random.Generator, kernel: str, m: int
) -> None:
    """The same chain on a wgs tile: each layer two dependent launches (w4a16_tile_x, then the
    tile, whose producer copies weights before it waits), every layer reusing its retiled x and
    split-K workspace three times over the chain."""
    _chain_same_bits(module, rng, kernel, m)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [c for c in MTC_CONFIGS if MTC_CONFIGS[c].ws])
def test_dependent_wgs_chain_with_the_other_trigger_gives_the_same_bits(
    module: object, rng: np.random.Generator, kernel: str
) -> None:
    """The same chain with the trigger the tile does not use by default (``late_trigger``: a tx
    tile's producer lets the next launch be scheduled before its own wait, any other tile's after
    it): the same bits as the plain launches."""
    _chain_same_bits(module, rng, kernel, 64, late_trigger=not MTC_CONFIGS[kernel].tx)


def _chain_same_bits(
    module: object, rng: np.random.Generator, kernel: str, m: int, late_trigger: bool | None = None
) -> None:
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear

    k = 1024
    weights = [prepack(random_weight(rng, k, k, 128, "bf16")) for _ in range(4)]
    layers = [W4A16Linear(module, w, m, kernel=kernel, late_trigger=late_trigger) for w in weights]
    x0 = cp.asarray(f32_to_bf16_bits((0.05 * rng.standard_normal((m, k))).astype(np.float32)))

    def chain(pdl: bool, sync: bool) -> Any:
        for layer in layers:
            layer.pdl = pdl
        a, b = x0.copy(), cp.full((m, k), 0xFFFF, cp.uint16)  # NaN where nothing was written yet
        for i in range(12):
            layers[i % len(layers)](a, b)
            if sync:
                cp.cuda.runtime.deviceSynchronize()
            a, b = b, a
        return a

    ref = cp.asnumpy(chain(pdl=False, sync=True))
    assert np.isfinite(bf16_bits_to_f32(ref)).all()
    got = cp.asnumpy(chain(pdl=True, sync=False))
    cp.cuda.runtime.deviceSynchronize()
    assert np.array_equal(got, ref), "eager PDL chain differs"

    # the same chain captured once and replayed: 12 layers end in the buffer the first one read
    bufs = (cp.empty_like(x0), cp.empty_like(x0))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        a, b = bufs
        for i in range(12):
            layers[i % len(layers)](a, b)
            a, b = b, a
        graph = stream.end_capture()
    assert a is bufs[0]
    for _ in range(3):
        bufs[0][...] = x0
        bufs[1].fill(0xFFFF)
        cp.cuda.runtime.deviceSynchronize()
        graph.launch(stream)
        stream.synchronize()
        assert np.array_equal(cp.asnumpy(bufs[0]), ref), "graph PDL chain differs"


def test_pdl_needs_a_module_whose_kernels_wait(
    fake_cupy: Callable[[np.ndarray], Any], rng: np.random.Generator
) -> None:
    """A module without the marker kernel (built from a w4a16.cu before pdl_wait) is refused for
    pdl=True and still serves plain launches."""
    from anvil_kernels.cuda import W4A16Linear
    from anvil_kernels.cuda.w4a16_linear import waits_for_predecessor

    class _Old:
        def get_function(self, name: str) -> Any:
            if name == PDL_MARKER:
                raise KeyError(name)
            return SimpleNamespace(name=name, max_dynamic_shared_size_bytes=0)

    old = _Old()
    assert not waits_for_predecessor(old)
    assert waits_for_predecessor(SimpleNamespace(get_function=lambda name: object()))
    packed = prepack(random_weight(rng, 256, 64, 128, "bf16"))
    with pytest.raises(ValueError, match="wait"):
        W4A16Linear(old, packed, 4, sm_count=132, kernel="gemv", pdl=True)
    assert W4A16Linear(old, packed, 4, sm_count=132, kernel="gemv").pdl is False
