"""Every CUDA kernel both test plans use (INT4 and fp32, MLP and BERT) compiles for sm_90 (and
sm_80) with nvcc; skipped where nvcc is absent."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
)

from torch_models import export_bert, export_mlp  # noqa: E402

from anvil_compiler.codegen.build import build_kernels  # noqa: E402
from anvil_compiler.errors import CompileError  # noqa: E402
from anvil_compiler.frontends.onnx import load_onnx  # noqa: E402
from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_graph  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_all_templates_of_both_plans_compile(tmp_path: Path) -> None:
    sources: dict[str, str] = {}
    models = [export_mlp(tmp_path / "mlp.onnx"), export_bert(tmp_path / "bert.onnx")]
    for path in models:
        for quantize in (True, False):
            low = compile_graph(
                load_onnx(path),
                CompileOptions(quantize=quantize, max_batch=8, max_seq=32, max_rel_error=None),
            )
            sources.update(low.sources)
    kinds = {name.split("_")[1] for name in sources}
    assert {"linear", "attention", "embed"} <= kinds
    files = build_kernels(sources, ("sm_80", "sm_90"), tmp_path / "out")
    fatbin = tmp_path / "out" / files["fatbin"]
    assert fatbin.stat().st_size > 1000
    assert (tmp_path / "out" / "kernels.cu").read_text().count("__global__") == len(sources)


def test_nvcc_error_comes_back_whole(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as err:
        build_kernels(
            {"broken": 'extern "C" __global__ void broken() { undefined_symbol(); }'}, ("sm_90",), tmp_path
        )
    assert "undefined_symbol" in err.value.detail and (tmp_path / "kernels.cu").exists()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_plans_carry_their_kernels_and_the_w4a16_fatbin(tmp_path: Path, precision: str) -> None:
    """A half plan (GPU precision fp16 or bf16, codegen/gpu_backend.py): every non-linear op's variant
    of that precision is in the fatbin next to its fp32 kernel, kernels.cu stays header-free (the
    NVRTC fallback at load), and INT4 linears get the W4A16 kernels of that activation type as
    w4a16.fatbin."""
    import json

    from onnx_models import mlp_bytes

    from anvil_compiler.pipeline import compile_model
    from anvil_core.plan_format import HALF_KERNEL_ATTRS, HALF_LINEAR_BACKENDS
    from anvil_core.proto_gen import plan_generated as pg

    attr, names = HALF_KERNEL_ATTRS[precision], HALF_LINEAR_BACKENDS[precision]
    other = "bf16" if precision == "fp16" else "fp16"
    path = export_bert(tmp_path / "bert.onnx")
    for quantize in (False, True):
        out = tmp_path / f"bert{quantize}"
        opts = CompileOptions(
            quantize=quantize, max_batch=8, max_seq=32, max_rel_error=None, gpu_precision=precision
        )
        manifest = compile_model("onnx", path.read_bytes(), "b", opts, out, "k", build=True)
        plan = pg.PlanT.InitFromPackedBuf((out / "plan.bin").read_bytes(), 0)
        src = (out / "kernels.cu").read_text()
        assert "#include" not in src
        for op in plan.ops:
            attrs = {a.key.decode(): (a.sval or b"").decode() for a in op.attrs}
            if op.kind.decode() == "linear":
                assert attrs["gpu_backend"] == (names["w4a16"] if quantize else names["cublas"])
            else:
                assert attrs[attr] in src and attrs[attr] != op.kernel.decode()
                assert HALF_KERNEL_ATTRS[other] not in attrs
        assert ("w4a16" in manifest["kernels"]) == quantize
        assert manifest["stats"]["gpu_precision"] == precision
        if quantize:
            fatbin = (out / "w4a16.fatbin").read_bytes()
            assert len(fatbin) > 1000 and "w4a16.fatbin" in manifest["files"]
            assert f"w4a16_{precision}_".encode() in fatbin and f"w4a16_{other}_".encode() not in fatbin
    mlp = tmp_path / "mlp"
    opts = CompileOptions(max_batch=8, max_rel_error=None)  # auto: an MLP stays fp32, no fp16 kernels
    manifest = compile_model("onnx", mlp_bytes(), "m", opts, mlp, "k", build=True)
    assert manifest["stats"]["gpu_precision"] == "fp32" and "w4a16" not in manifest["kernels"]
    assert json.loads((mlp / "manifest.json").read_text())["stats"]["gpu_linear_backends"] == {"plan_int4": 2}
