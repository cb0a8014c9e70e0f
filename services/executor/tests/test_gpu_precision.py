"""What an fp16 GPU plan decides on the host, tested without a GPU: the precision the compiler recorded,
the device dtype of every tensor, which kernel runs every op, the weight bank an fp16 plan lays out
(fp16 weights, W4A16 prepacked INT4, dequantized fp16 above the W4A16 rows), the launch table with those
substitutions, and which fp16 epilogue a linear gets. The kernels themselves run in test_gpu_plan.py
(marked gpu); test_gpu_sources.py compiles them here."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model
from anvil_executor.plan_runtime.buckets import Buckets
from anvil_executor.plan_runtime.cublas_linear import GemmStep
from anvil_executor.plan_runtime.gpu_linear import LN_WARP_MAX_N, F16Linears, epilogue_f16_launch
from anvil_executor.plan_runtime.launch import resolve_launches
from anvil_executor.plan_runtime.plan import DTYPES, _s, attrs_of, load_plan
from anvil_executor.plan_runtime.precision import (
    BF16,
    device_dtypes,
    half_dtype,
    half_kernels,
    plan_precision,
    resolve_precision,
    to_f32,
    to_half,
)
from anvil_kernels import Int4Weight, dequantize
from anvil_kernels.cuda import unprepack
from anvil_kernels.format import f32_to_bf16_bits

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "compiler" / "tests"))
from onnx_models import mlp_bytes
from tiny_bert import make_tiny_bert


def _bert(tmp_path: Path, quantize: bool, precision: str = "auto") -> Path:
    hf = make_tiny_bert(tmp_path / "hf", hidden=64, heads=2)
    art = tmp_path / f"bert-{quantize}-{precision}"
    opts = CompileOptions(
        quantize=quantize, max_batch=8, max_seq=32, gpu_precision=precision, max_rel_error=None, group_size=64
    )
    compile_model("hf", bundle_from_dir(hf), "tiny", opts, art, "k", build=False)
    return art


def _mlp(tmp_path: Path, quantize: bool, precision: str = "fp16", op: str = "Relu") -> Path:
    art = tmp_path / f"mlp-{quantize}-{precision}-{op}"
    opts = CompileOptions(
        quantize=quantize, max_batch=8, max_seq=1, gpu_precision=precision, max_rel_error=None, group_size=64
    )
    compile_model("onnx", mlp_bytes(op=op), "mlp", opts, art, "k", build=False)
    return art


def _host(art: Path) -> tuple[Any, list[np.ndarray]]:
    p = load_plan(art / "plan.bin").plan
    w = load_file(str(art / "weights.safetensors"))
    return p, [np.ascontiguousarray(w[_s(wi.name)], dtype=DTYPES[wi.dtype]) for wi in p.weights]


def test_the_compiler_records_fp16_for_encoders_and_fp32_otherwise(tmp_path: Path) -> None:
    bert, mlp = load_plan(_bert(tmp_path, False) / "plan.bin").plan, _mlp(tmp_path, False, "auto")
    assert plan_precision(bert) == "fp16" and plan_precision(load_plan(mlp / "plan.bin").plan) == "fp32"
    assert resolve_precision("auto", bert) == "fp16" and resolve_precision("fp32", bert) == "fp32"
    with pytest.raises(ValueError, match="no fp16 kernels"):
        resolve_precision("fp16", load_plan(mlp / "plan.bin").plan)
    kernels = half_kernels(bert, "fp16")
    for i, op in enumerate(bert.ops):  # every op but the linears has an fp16 kernel, and only those
        attrs = attrs_of(op)
        if _s(op.kind) == "linear":
            assert i not in kernels and attrs["gpu_backend"] == "cublas_f16"
        else:
            assert kernels[i] != _s(op.kernel)  # a distinct specialization
            assert "kernel_f16" in attrs


def test_fp16_device_dtypes_keep_ints_and_the_pooled_vector(tmp_path: Path) -> None:
    p = load_plan(_bert(tmp_path, False) / "plan.bin").plan
    dts = device_dtypes(p)
    pooled = {int(o) for op in p.ops if _s(op.kind) == "mean_pool_l2" for o in op.outputs}
    assert pooled, "the encoder pools"
    for i, ti in enumerate(p.tensors):
        plan_dt = np.dtype(DTYPES[ti.dtype])
        if i in pooled:
            assert dts[i] == np.float32  # the served vector, written fp32 by the fp16 kernel
        elif plan_dt == np.float32:
            assert dts[i] == np.float16
        else:
            assert dts[i] == plan_dt  # ids and mask as the client sends them


def test_bf16_values_round_to_nearest_even_and_come_back_exactly() -> None:
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3.0e38, 1e-40, np.inf, np.nan], np.float32)
    bits = to_half(x, "bf16")
    assert bits.dtype == BF16
    back = to_f32(bits)
    assert back.dtype == np.float32
    # ties go to the even mantissa: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6 (bf16 keeps 7 bits)
    np.testing.assert_array_equal(back[:4], [1.0, 1.0, 1 + 2**-6, -2.5])
    assert np.isfinite(back[4]) and abs(back[4] / 3.0e38 - 1) <= 2**-8  # fp32's range, 8 bits kept
    assert back[5] > 0 and np.isinf(back[6]) and np.isnan(back[7])
    assert np.array_equal(to_f32(to_half(back, "bf16")), back, equal_nan=True)  # exact once rounded
    assert to_half(x[:4], "fp16").dtype == np.float16 and to_f32(np.arange(3)).dtype != np.float32
    with pytest.raises(ValueError, match="not a half precision"):
        half_dtype("fp32")


def test_a_bf16_plan_records_bf16_kernels_dtypes_and_linears(tmp_path: Path) -> None:
    """--gpu-precision bf16: every op but the linears names its bf16 kernel, float tensors are bf16 on
    the device (the pooled vector fp32), linears run cuBLAS / W4A16 in bf16 on bf16 weights, and
    neither half precision runs the other's plan."""
    bert = load_plan(_bert(tmp_path, False, "bf16") / "plan.bin").plan
    f16 = load_plan(_bert(tmp_path / "h", False, "fp16") / "plan.bin").plan
    assert plan_precision(bert) == "bf16" and resolve_precision("auto", bert) == "bf16"
    assert resolve_precision("fp32", bert) == "fp32"
    with pytest.raises(ValueError, match="no fp16 kernels"):
        resolve_precision("fp16", bert)
    with pytest.raises(ValueError, match="no bf16 kernels"):
        resolve_precision("bf16", f16)
    kernels = half_kernels(bert, "bf16")
    for i, op in enumerate(bert.ops):
        attrs = attrs_of(op)
        assert "kernel_f16" not in attrs
        if _s(op.kind) == "linear":
            assert i not in kernels and attrs["gpu_backend"] == "cublas_bf16"
        else:
            assert kernels[i] == attrs["kernel_bf16"] != _s(op.kernel)
    with pytest.raises(ValueError, match="has no fp16 kernel"):
        half_kernels(bert, "fp16")
    pooled = {int(o) for op in bert.ops if _s(op.kind) == "mean_pool_l2" for o in op.outputs}
    for i, (ti, dt) in enumerate(zip(bert.tensors, device_dtypes(bert, "bf16"), strict=True)):
        plan_dt = np.dtype(DTYPES[ti.dtype])
        assert dt == (np.float32 if i in pooled else BF16 if plan_dt == np.float32 else plan_dt)
    with pytest.raises(ValueError, match="is not one of"):
        F16Linears(bert, 8, 32, w4a16_available=True)  # the fp16 runtime refuses bf16 linears
    p, host = _host(_bert(tmp_path / "q", True, "bf16"))
    lins = F16Linears(p, 8, 32, w4a16_available=True, precision="bf16")
    layout = lins.layout(host)
    for i, lin in lins.lins.items():
        assert (lin.backend, lin.kind, lin.precision) == ("w4a16_bf16", "w4a16", "bf16")
        q = Int4Weight(*(host[ix] for ix in lin.int4 or ()), lin.group, lin.step.k, lin.step.n, "fp16")  # type: ignore[misc]
        dense = layout.arrays[("w16", i)]  # 8 x 32 rows > 16: cuBLAS bf16 on the dequantized weights
        assert dense.dtype == BF16
        np.testing.assert_array_equal(dense, f32_to_bf16_bits(dequantize(q)))
        assert i in lins._prepacked  # the same prepacked INT4 as fp16: the scale kind is the weight's
    for r in lins.report(Buckets.for_plan(8, 32).all()):
        assert set(r["rows"]) <= {"w4a16_gemv", "w4a16_gemv+epilogue", "cublas_bf16+epilogue"}
    step = next(iter(lins.lins.values())).step
    names = {epilogue_f16_launch(step, lambda i: 256, lambda i: 256, 256, m, "bf16")[0] for m in (1, 64)}
    assert names and all(n.startswith("anvil_bf16_epilogue") for n in names)


@pytest.mark.parametrize("w4a16", [True, False])
def test_int4_linears_get_w4a16_weights_up_to_its_rows_and_dense_fp16_above(
    tmp_path: Path, w4a16: bool
) -> None:
    p, host = _host(_bert(tmp_path, True))
    lins = F16Linears(p, 8, 32, w4a16_available=w4a16)
    layout = lins.layout(host)
    assert lins.lins and all(lin.int4 is not None for lin in lins.lins.values())
    for i, lin in lins.lins.items():
        assert lin.backend == ("w4a16" if w4a16 else "cublas_f16_dequant")
        q = Int4Weight(*(host[ix] for ix in lin.int4), lin.group, lin.step.k, lin.step.n, "fp16")  # type: ignore[misc]
        dense = layout.arrays[("w16", i)]  # 8 x 32 rows > 16: cuBLAS on the dequantized weights
        np.testing.assert_array_equal(dense, dequantize(q).astype(np.float16))
        if w4a16:
            back = unprepack(lins._prepacked[i])
            assert np.array_equal(back.packed, q.packed) and np.array_equal(back.scales, q.scales)
        else:
            assert i not in lins._prepacked
    offs = lins.weight_offsets(len(host))
    replaced = {ix for lin in lins.lins.values() for ix in (lin.int4 or ())}
    assert all(offs[ix] == -1 for ix in replaced)
    kept = sorted((offs[i], host[i].nbytes) for i in range(len(host)) if i not in replaced)
    assert all(o % 256 == 0 for o, _ in kept)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(kept))  # no overlap
    report = lins.report(Buckets.for_plan(8, 32).all())
    for r in report:
        if w4a16:  # B x T rows: 8 (1 x 8) runs W4A16, 16 x 16 and above cuBLAS
            assert set(r["rows"]) <= {"w4a16_gemv", "w4a16_gemv+epilogue", "cublas_f16+epilogue"}
            assert min(v[0] for v in r["rows"].values()) == 8
        else:
            assert set(r["rows"]) == {"cublas_f16+epilogue"}


def test_small_int4_mlp_runs_w4a16_only_with_fused_epilogues_where_it_can(tmp_path: Path) -> None:
    p, host = _host(_mlp(tmp_path, True, op="Relu"))
    lins = F16Linears(p, 8, 1, w4a16_available=True)
    layout = lins.layout(host)
    for i, lin in lins.lins.items():
        assert lin.backend == "w4a16" and lin.max_rows == 8 and not lin.needs_dense
        assert ("w16", i) not in layout.arrays  # M <= 8 <= w4a16_max_m: no dense copy on the device
        assert lin.fused  # relu and none: bias + activation inside the W4A16 kernel
        if lin.step.bias >= 0:
            np.testing.assert_array_equal(layout.arrays[("b16", i)], host[lin.step.bias].astype(np.float16))
    p2, host2 = _host(_mlp(tmp_path, True, op="Sigmoid"))
    lins2 = F16Linears(p2, 8, 1, w4a16_available=True)
    lins2.layout(host2)
    acts = {lin.act_name: lin.fused for lin in lins2.lins.values()}
    assert acts.get("sigmoid") is False  # not a W4A16 activation: W4A16 into tmp, then the epilogue


def test_fp16_launch_table_uses_the_fp16_kernels_and_skips_the_linears(tmp_path: Path) -> None:
    p, host = _host(_bert(tmp_path, False))
    lins = F16Linears(p, 8, 32, w4a16_available=True)
    lins.layout(host)
    kernels = half_kernels(p, "fp16")
    launches = resolve_launches(
        p, 1 << 40, 1 << 36, 4, 16, lins.weight_offsets(len(host)), kernels, lins.lins
    )
    for i, (op, launch) in enumerate(zip(p.ops, launches, strict=True)):
        if _s(op.kind) == "linear":
            assert launch.kernel == "" and launch.args == ()
        else:
            assert launch.kernel == kernels[i]
    with pytest.raises(ValueError, match="not on the device"):  # a kernel may not read a replaced weight
        offs = [-1] * len(host)
        resolve_launches(p, 1 << 40, 1 << 36, 4, 16, offs, kernels, ())


PLAN = SimpleNamespace(tensors=[SimpleNamespace(offset=o) for o in (0, 1 << 20, 2 << 20, (3 << 20) + 4)])


def _step(n: int, ln: bool, out: int = 2) -> GemmStep:
    return GemmStep(
        op_index=0, x=0, out=out, residual=1 if ln else -1, weight=0, bias=1,
        gamma=2 if ln else -1, beta=3 if ln else -1, k=384, n=n, act=2, eps=1e-12,
    )  # fmt: skip


def _addr(ix: int) -> int:
    return 0 if ix < 0 else (1 << 30) + int(PLAN.tensors[ix].offset)


def test_fp16_epilogue_choice() -> None:
    kernel, grid, block, smem, args = epilogue_f16_launch(_step(384, True), _addr, _addr, 1 << 28, m=1000)
    assert kernel == "anvil_f16_epilogue_ln_warp" and smem == 0
    assert grid[0] * (block[0] // 32) >= 1000 > (grid[0] - 1) * (block[0] // 32)
    assert int(args[6]) == 1000 and int(args[7]) == 384
    wide = epilogue_f16_launch(_step(LN_WARP_MAX_N + 2, True), _addr, _addr, 1 << 28, m=7)
    assert wide[0] == "anvil_f16_epilogue" and wide[1] == (7, 1, 1) and wide[3] == 4 * (LN_WARP_MAX_N + 2)
    odd = epilogue_f16_launch(_step(383, True), _addr, _addr, 1 << 28, m=7)  # pairs need an even row
    assert odd[0] == "anvil_f16_epilogue"
    kernel, grid, block, _, args = epilogue_f16_launch(_step(1536, False), _addr, _addr, 1 << 28, m=50)
    assert kernel == "anvil_f16_epilogue_v8" and int(args[4]) == 50 * 1536 // 8 and int(args[5]) == 1536 // 8
    assert grid[0] * block[0] >= int(args[4])
    assert (
        epilogue_f16_launch(_step(1536, False, out=3), _addr, _addr, 1 << 28, m=5)[0] == "anvil_f16_epilogue"
    )
    assert epilogue_f16_launch(_step(20, False), _addr, _addr, 1 << 28, m=5)[0] == "anvil_f16_epilogue"


class _FakeW4A16Linear:
    """Stands in for anvil_kernels.cuda.W4A16Linear: records its table, and fails as ModuleSet's
    get_function does (KeyError) when M's kernel is not in the module (``module``: the kernel names
    it holds); like the real one it looks up M = 1 and m_max at construction, the rest in ``plan``."""

    def __init__(self, module: set[str], packed: Any, m_max: int, **kw: Any) -> None:
        self.module, self.table, self.m_max = module, kw.get("table"), m_max
        self.plan(1)
        self.plan(m_max)

    def choice(self, m: int) -> Any:
        from anvil_kernels.cuda.w4a16_dispatch import choose

        return choose(m, 8192, 8192, 128, self.table)

    def plan(self, m: int) -> None:
        if self.choice(m).kernel not in self.module:
            raise KeyError(f"no kernel {self.choice(m).kernel!r}")


def test_w4a16_layers_run_the_plans_measured_kernels_for_their_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    import anvil_kernels.cuda as kcuda
    from anvil_executor.plan_runtime.gpu_linear import LinearF16

    monkeypatch.setattr(kcuda, "W4A16Linear", _FakeW4A16Linear)
    step = GemmStep(
        op_index=0,
        x=0,
        out=1,
        residual=-1,
        weight=-1,
        bias=-1,
        gamma=-1,
        beta=-1,
        k=8192,
        n=8192,
        act=0,
        eps=0.0,
    )
    rows = (("sm_90", ((1, "gvb8w", None), (4, "gemv", None), (16, "gemv", None))),)
    lin = LinearF16(step, "w4a16", 16, "none", group=128, int4=(0, 1, 2), max_rows=64, w4a16_rows=rows)
    layer = F16Linears._w4a16_layer(lin, {}, {"gemv", "gvb8w"}, "sm_90")
    assert [layer.choice(m).kernel for m in (1, 2, 16)] == ["gvb8w", "gemv", "gemv"]
    assert layer.m_max == 16 and layer.choice(1).source == "table"
    other = F16Linears._w4a16_layer(lin, {}, {"gemv"}, "sm_89")  # no rows for this arch: the rule
    assert other.table is None and other.choice(1).kernel == "gemv"
    lacking = F16Linears._w4a16_layer(lin, {}, {"gemv"}, "sm_90")  # the fatbin lacks gvb8w: the rule
    assert lacking.table is None and lacking.choice(1).kernel == "gemv"
    middle = (("sm_90", ((1, "gemv", None), (4, "gvb8w", None), (16, "gemv", None))),)  # gvb8w: M = 2..4
    lin2 = LinearF16(step, "w4a16", 16, "none", group=128, int4=(0, 1, 2), max_rows=64, w4a16_rows=middle)
    assert F16Linears._w4a16_layer(lin2, {}, {"gemv"}, "sm_90").table is None  # found missing at load
    # an sm_90 plan's tiles past the rule's 16 rows: run where the module holds them, else refused
    # (the rule would name tiles the artifact does not hold, and no dense weights cover those rows)
    tiled = (("sm_90", (*rows[0][1], (32, "mtc32", 8), (64, "wgs64n", 4))),)
    lin3 = LinearF16(step, "w4a16", 64, "none", group=128, int4=(0, 1, 2), max_rows=64, w4a16_rows=tiled)
    layer = F16Linears._w4a16_layer(lin3, {}, {"gemv", "gvb8w", "mtc32", "wgs64n"}, "sm_90")
    got = [(layer.choice(m).kernel, layer.choice(m).split) for m in (16, 17, 33, 64)]
    assert got == [("gemv", None), ("mtc32", 8), ("wgs64n", 4), ("wgs64n", 4)] and layer.m_max == 64
    with pytest.raises(ValueError, match=r"8192x8192: .* up to 64 rows but w4a16.fatbin lacks"):
        F16Linears._w4a16_layer(lin3, {}, {"gemv", "gvb8w", "mtc32"}, "sm_90")
    with pytest.raises(ValueError, match=r"up to 64 rows but no measured rows for sm_100"):
        F16Linears._w4a16_layer(lin3, {}, {"gemv", "gvb8w", "mtc32", "wgs64n"}, "sm_100")
    lin4 = LinearF16(step, "w4a16", 64, "none", group=128, int4=(0, 1, 2), max_rows=16, w4a16_rows=tiled)
    assert F16Linears._w4a16_layer(lin4, {}, {"gemv"}, "sm_100").m_max == 16  # 16 rows at most: the rule


def test_a_plans_w4a16_rows_are_checked(tmp_path: Path) -> None:
    from anvil_executor.plan_runtime.gpu_linear import f16_linears
    from anvil_executor.plan_runtime.plan import pg

    p, _ = _host(_mlp(tmp_path, True))
    op = next(op for op in p.ops if _s(op.kind) == "linear")
    assert attrs_of(op)["gpu_backend"] == "w4a16" and "w4a16_kernels" not in attrs_of(op)  # unmeasured
    assert all(lin.w4a16_rows == () for lin in f16_linears(p, 8, 1, True).values())
    bad = pg.AttrT()
    bad.key, bad.sval = "w4a16_kernels", "sm_90:1=gemv/2"
    op.attrs = [*(op.attrs or []), bad]
    with pytest.raises(ValueError, match=r"op .*w4a16 rows: bad row"):
        f16_linears(p, 8, 1, True)
    bad.sval = "sm_90:1=gemv,32=mtc32/8"  # a tile with its split: read
    assert {lin.w4a16_rows for lin in f16_linears(p, 8, 1, True).values() if lin.w4a16_rows} == {
        (("sm_90", ((1, "gemv", None), (32, "mtc32", 8))),)
    }
    negative = next(a for a in op.attrs if _s(a.key) == "w4a16_max_m")
    negative.ival = -1
    with pytest.raises(ValueError, match=r"w4a16_max_m must be >= 0"):
        f16_linears(p, 8, 1, True)
