"""The built-ins on a real CUDA device (``ANVIL_GPU_BUILTINS=device``): the seeded MLPs as compiled
plans (TF32 cuBLAS) against the numpy models, `identity` as a device round trip that returns every
byte, across slot boundaries and on each lane, and nothing allocated on the device once loaded.
    make test-gpu          (on a GPU host: every test marked gpu)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_device import cupy_or_skip

pytestmark = pytest.mark.gpu
cp = cupy_or_skip()

from anvil_executor.device import parse_device  # noqa: E402
from anvil_executor.models import gpu_builtins  # noqa: E402
from anvil_executor.models.builtin import DeepMlpModel, MlpModel  # noqa: E402
from anvil_executor.plan_runtime.cuda_arena import counter  # noqa: E402
from anvil_executor.plan_runtime.gpu_identity import GpuIdentityModel  # noqa: E402
from anvil_executor.plan_runtime.lanes import use_lane  # noqa: E402

GPU = {"gemm": "cublas", "tf32": True, "precision": "auto", "lt_epilogue": False, "sync": "spin"}


@pytest.mark.parametrize("name", ["mlp", "mlp4x1024"])
def test_a_seeded_mlp_runs_as_a_plan_on_the_gpu(name: str, tmp_path: Path) -> None:
    model, plan = gpu_builtins.load_device_builtin(name, tmp_path, 16, parse_device("cuda:0"), GPU, lanes=2)
    assert model.spec.platform == "anvil_plan_cuda" and plan.graph_count > 0
    numpy_model = MlpModel(16) if name == "mlp" else DeepMlpModel(16)
    rng = np.random.default_rng(5)
    width = numpy_model.spec.inputs[0].dims[0]
    for lane in (0, 1):
        with use_lane(lane):
            reqs = [{"INPUT0": rng.standard_normal((n, width)).astype(np.float32)} for n in (1, 7, 16, 3)]
            got = np.concatenate([o["OUTPUT0"] for o in model.run(reqs)])
            ref = np.concatenate([o["OUTPUT0"] for o in numpy_model.run(reqs)])
            scale = float(np.abs(ref).max())
            assert np.abs(got - ref).max() <= 5e-3 * scale  # TF32 products, fp32 sums


def test_identity_returns_every_byte_through_the_device() -> None:
    model = GpuIdentityModel(16, 0, lanes=2, slot_bytes=256)  # small: most batches cross the slot
    rng = np.random.default_rng(7)
    for lane in (0, 1):
        with use_lane(lane):
            for _ in range(20):
                shapes = [
                    (int(rng.integers(1, 3)), int(rng.integers(0, 200)))
                    for _ in range(int(rng.integers(1, 6)))
                ]
                batch = [{"INPUT0": rng.standard_normal(s).astype(np.float32)} for s in shapes]
                for req, out in zip(batch, model.run(batch), strict=True):
                    np.testing.assert_array_equal(out["OUTPUT0"], req["INPUT0"])
    assert model.runs > 40 and model.copied_bytes > 0


def test_the_device_builtins_allocate_nothing_once_loaded(tmp_path: Path) -> None:
    mlp, _ = gpu_builtins.load_device_builtin("mlp", tmp_path, 16, parse_device("cuda:0"), GPU)
    ident, _ = gpu_builtins.load_device_builtin("identity", tmp_path, 16, parse_device("cuda:0"), GPU)
    x = np.ones((4, 16), np.float32)
    big = np.ones((1, 3 << 20), np.float32)  # 12 MiB: three slot-fulls
    mlp.run([{"INPUT0": x}])
    ident.run([{"INPUT0": big}])
    counter.mark_steady()
    for _ in range(2_000):
        mlp.run([{"INPUT0": x}, {"INPUT0": x[:1]}])
        ident.run([{"INPUT0": x}])
    ident.run([{"INPUT0": big}])
    assert counter.steady_allocations == 0 and counter.steady_module_loads == 0
