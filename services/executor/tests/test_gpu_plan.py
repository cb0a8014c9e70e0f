"""The GPU backend of the plan runtime against its CPU twin, on a real CUDA device.

Compiled artifacts (fatbin from nvcc, or kernels.cu through NVRTC) are served by ``GpuPlanModel``
from a device arena with NaN-filled activations (an element a kernel forgets to write shows up),
through CUDA graphs per shape bucket; the CPU runtime (``PlanModel``) on the same artifact is the
reference. The steady state is checked to allocate nothing over 10,000 batches.
    make test-gpu          (on a GPU host: every test marked gpu)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_device import cupy_or_skip

pytestmark = pytest.mark.gpu
cp = cupy_or_skip()
torch = pytest.importorskip("torch", reason="the test models are exported from torch")

sys.path.insert(0, str(Path(__file__).parents[2] / "compiler" / "tests"))
from torch_models import export_bert, export_mlp  # noqa: E402

from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_model  # noqa: E402
from anvil_executor.plan_runtime import PlanModel  # noqa: E402
from anvil_executor.plan_runtime.cuda_arena import DeviceArena, DeviceMemoryError, counter  # noqa: E402
from anvil_executor.plan_runtime.gpu_model import GpuPlanModel, load_module  # noqa: E402
from anvil_executor.plan_runtime.plan import load_plan  # noqa: E402


def _arch() -> str:
    return f"sm_{cp.cuda.Device(0).compute_capability}"


def _artifact(tmp_path: Path, kind: str, quantize: bool, precision: str = "fp32") -> Path:
    """fp32 plans here (the compiler's kernels and TF32 cuBLAS against the CPU twin at 2e-3); fp16
    plans: test_gpu_fp16.py."""
    src = export_mlp(tmp_path / "m.onnx") if kind == "mlp" else export_bert(tmp_path / "m.onnx")
    opts = CompileOptions(
        quantize=quantize, max_batch=8, max_seq=64, archs=(_arch(),), gpu_precision=precision
    )
    out = tmp_path / "art"
    compile_model("onnx", src.read_bytes(), kind, opts, out, f"{kind}-{quantize}", build=True)
    return out


def _gpu(art: Path, **kw: Any) -> GpuPlanModel:
    from safetensors.numpy import load_file

    return GpuPlanModel(
        load_plan(art / "plan.bin"), load_file(str(art / "weights.safetensors")), load_module(art, 0), 0, **kw
    )


def _requests(kind: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    if kind == "mlp":
        return [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (3, 1, 4, 2)]
    reqs = []
    for n in (20, 7, 33, 12):  # different lengths: padded inside a bucket, mask 0 on padding
        ids = rng.integers(0, 500, (1, n)).astype(np.int64)
        reqs.append({"input_ids": ids, "attention_mask": np.ones((1, n), np.int64)})
    return reqs


def _close(gpu: list[dict[str, np.ndarray]], cpu: list[dict[str, np.ndarray]]) -> None:
    for g, c in zip(gpu, cpu, strict=True):
        for name, ref in c.items():
            assert g[name].shape == ref.shape
            assert np.isfinite(g[name]).all(), f"{name}: unwritten (NaN) elements"
            np.testing.assert_allclose(g[name], ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


@pytest.mark.parametrize("kind", ["mlp", "bert"])
@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("gemm", ["plan", "cublas"])
def test_gpu_plan_matches_its_cpu_twin(tmp_path: Path, kind: str, quantize: bool, gemm: str) -> None:
    art = _artifact(tmp_path, kind, quantize)
    gpu = _gpu(art, nan_fill=True, gemm=gemm)
    if gemm == "plan" or not quantize:  # fp32 linears go to cuBLAS unless told otherwise
        assert bool(gpu._gemm) == (gemm == "cublas")
    assert gpu.graph_count == len(gpu.buckets.all()), gpu.graph_error
    cpu = PlanModel.load(art)
    reqs = _requests(kind, np.random.default_rng(1))
    _close(gpu.run(reqs), cpu.run(reqs))
    eager = _gpu(art, graphs=False, nan_fill=True, gemm=gemm)  # graphs replay exactly what eager runs
    for g, e in zip(gpu.run(reqs), eager.run(reqs), strict=True):
        for name in g:
            np.testing.assert_array_equal(g[name], e[name])


@pytest.mark.parametrize("quantize", [True, False])  # INT4 plan kernels; fp32 linears on cuBLAS
def test_steady_state_allocates_nothing_over_10000_batches(tmp_path: Path, quantize: bool) -> None:
    art = _artifact(tmp_path, "mlp", quantize)
    gpu = _gpu(art)
    assert gpu.graph_count == len(gpu.buckets.all()), gpu.graph_error
    cpu = PlanModel.load(art)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((n, 64)).astype(np.float32) for n in range(1, 9)]
    for x in xs:  # every bucket once before the count starts
        gpu.run([{"x": x}])
    counter.mark_steady()
    for i in range(10_000):
        out = gpu.run([{"x": xs[i % 8]}])
    assert counter.steady_allocations == 0
    assert counter.steady_module_loads == 0
    np.testing.assert_allclose(out[0]["y"], cpu.run([{"x": xs[9_999 % 8]}])[0]["y"], rtol=2e-3, atol=2e-3)
    assert 0.0 <= gpu.padding_waste < 0.5


def test_a_model_larger_than_the_free_memory_is_refused_with_the_sizes() -> None:
    _, total = cp.cuda.runtime.memGetInfo()
    with pytest.raises(DeviceMemoryError, match=r"needs .* MiB on cuda:0 .* MiB are free"):
        DeviceArena({"weights": int(total), "activations": 1 << 20}, 0, what="model 'huge'")
    arena = DeviceArena({"weights": 1 << 20}, 0)  # the device still serves what fits
    arena.write("weights", 256, np.arange(8, dtype=np.float32))
    assert cp.asnumpy(arena.view("weights", 256, (8,), np.float32)).tolist() == list(range(8))


def test_kernels_cu_alone_is_compiled_at_load(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "mlp", False)
    for f in list(art.glob("kernels.*bin")) + list(art.glob("*.cubin")):
        f.unlink()
    assert (art / "kernels.cu").is_file()
    gpu = _gpu(art)  # CuPy's NVRTC builds the module from the source the artifact carries
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    _close(gpu.run([{"x": x}]), PlanModel.load(art).run([{"x": x}]))


def test_a_text_encoder_on_the_gpu_copies_out_only_its_vectors(tmp_path: Path) -> None:
    """An HF encoder artifact served as text: the GPU plan moves only ``sentence_embedding`` to the
    host (not the (B, T, H) token states) and embeds like the CPU runtime."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_bert import make_tiny_bert

    from anvil_compiler.frontends.hf import bundle_from_dir
    from anvil_executor.artifact import load_artifact
    from anvil_executor.device import parse_device

    hf = make_tiny_bert(tmp_path / "hf")
    art = tmp_path / "art"
    opts = CompileOptions(quantize=False, max_batch=8, max_seq=32, archs=(_arch(),), gpu_precision="fp32")
    compile_model("hf", bundle_from_dir(hf), "tiny", opts, art, "k", build=True)
    gpu_model, gpu_plan = load_artifact(art, parse_device("cuda:0"), "tiny")
    cpu_model, _ = load_artifact(art, parse_device("cpu"), "tiny")
    assert [o[0] for o in gpu_plan.outputs] == ["sentence_embedding"]
    texts = ["the cat sat on the mat", "a dog runs", "red model serves blue text fast", "slow"]
    reqs = [{"TEXT": np.array([t.encode() for t in texts], dtype=object)}]
    got, ref = gpu_model.run(reqs)[0]["EMBEDDING"], cpu_model.run(reqs)[0]["EMBEDDING"]
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)


def test_two_lanes_run_at_once_from_two_threads_and_match_the_cpu_twin(tmp_path: Path) -> None:
    """ANVIL_LANES on a GPU (plan_runtime/lanes.py): two instances, two streams, two threads hammering
    them at once; every answer equals the CPU twin's and nothing is allocated in steady state."""
    import threading

    from anvil_executor.plan_runtime.lanes import LanedPlan, set_lane

    art = _artifact(tmp_path, "bert", False)
    laned = LanedPlan([_gpu(art, nan_fill=True), _gpu(art, nan_fill=True)])
    assert laned.graph_count == 2 * len(laned.lanes[0].buckets.all())  # type: ignore[attr-defined]
    assert laned.lanes[0].stream.ptr != laned.lanes[1].stream.ptr  # type: ignore[attr-defined]
    cpu = PlanModel.load(art)
    rng = np.random.default_rng(5)
    sets = [_requests("bert", rng) for _ in range(4)]
    want = [cpu.run(reqs) for reqs in sets]
    for lane in (0, 1):  # every bucket of every lane once before the count starts
        from anvil_executor.plan_runtime.lanes import use_lane

        with use_lane(lane):
            for reqs in sets:
                laned.run(reqs)
    counter.mark_steady()
    failures: list[BaseException] = []

    def hammer(lane: int) -> None:
        set_lane(lane)
        try:
            for i in range(200):
                k = (i + lane) % len(sets)
                _close(laned.run(sets[k]), want[k])
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(lane,)) for lane in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures[0]
    assert counter.steady_allocations == 0 and counter.steady_module_loads == 0
