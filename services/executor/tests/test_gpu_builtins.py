"""The built-ins on a GPU executor, without a GPU: the seeded MLPs written as ONNX and compiled by
the compiler give plans that compute exactly what the numpy models compute (the CPU backend runs
them here), `identity`'s device round trip packs batches into its slot and splits what does not fit
(CuPy faked: the copies are recorded), and the executor picks device or host per
``ANVIL_GPU_BUILTINS``. On a GPU: test_gpu_builtins_cuda.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_executor.artifact import load_artifact
from anvil_executor.device import parse_device
from anvil_executor.models import gpu_builtins
from anvil_executor.models.builtin import BusyModel, DeepMlpModel, MlpModel, mlp_reference
from anvil_executor.plan_runtime.lanes import use_lane
from anvil_executor.service import Executor
from anvil_executor.settings import ExecutorSettings

pytest.importorskip("onnx", reason="the compiler's dependency; installed by `make sync`")


@pytest.mark.parametrize("name", ["mlp", "mlp4x1024"])
def test_a_seeded_mlp_compiles_to_a_plan_of_the_numpy_models_numbers(name: str, tmp_path: Path) -> None:
    path = gpu_builtins.compile_mlp(name, tmp_path, 8, build_kernels=False)
    mtime = (path / "plan.bin").stat().st_mtime_ns
    assert gpu_builtins.compile_mlp(name, tmp_path, 8, build_kernels=False) == path  # content address
    assert (path / "plan.bin").stat().st_mtime_ns == mtime  # found, not compiled again
    assert not list(tmp_path.glob(".*.onnx"))  # the ONNX written for the compiler is gone

    plan, _ = load_artifact(path, parse_device("cpu"), name)
    numpy_model = MlpModel(8) if name == "mlp" else DeepMlpModel(8)
    assert plan.spec.inputs == numpy_model.spec.inputs and plan.spec.outputs == numpy_model.spec.outputs
    x = np.random.default_rng(3).standard_normal((11, numpy_model.spec.inputs[0].dims[0])).astype(np.float32)
    reqs = [{"INPUT0": x[:1]}, {"INPUT0": x[1:8]}, {"INPUT0": x[8:]}]  # 11 rows: two chunks of <= 8
    got = np.concatenate([o["OUTPUT0"] for o in plan.run(reqs)])
    ref = mlp_reference(x) if name == "mlp" else np.concatenate([o["OUTPUT0"] for o in numpy_model.run(reqs)])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_only_the_seeded_mlps_have_a_recipe() -> None:
    with pytest.raises(ValueError, match="not a seeded MLP built-in"):
        gpu_builtins.mlp_layers("identity")
    with pytest.raises(ValueError, match="needs a CUDA executor"):
        gpu_builtins.load_device_builtin("mlp", Path("."), 8, parse_device("cpu"), {})


def test_identity_round_trips_batches_through_its_slot(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy  # the fake (conftest): copies are recorded, not made

    from anvil_executor.plan_runtime.gpu_identity import GpuIdentityModel

    copies: list[tuple[int, int, int, int]] = []

    def record(dst: int, src: int, n: int, kind: int, stream: int) -> None:
        copies.append((dst, src, n, kind))

    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", record)
    model = GpuIdentityModel(8, 0, lanes=2, slot_bytes=64)
    assert model.spec.platform == "anvil_cuda" and model.arena.usage() == {"staging": 128}
    rng = np.random.default_rng(0)
    sizes = [(1, 3), (1, 0), (2, 10), (1, 5)]  # 3 + 0 + 20 + 5 floats = 112 bytes: two round trips
    batch = [{"INPUT0": rng.standard_normal(s).astype(np.float32)} for s in sizes]
    outs = model.run(batch)
    for req, out in zip(batch, outs, strict=True):
        assert out["OUTPUT0"].shape == req["INPUT0"].shape and out["OUTPUT0"] is not req["INPUT0"]
        np.testing.assert_array_equal(out["OUTPUT0"], req["INPUT0"])
    dev0, host0 = model.arena.ptr("staging"), model.pinned.base
    assert copies == [(dev0, host0, 64, 1), (host0, dev0, 64, 2), (dev0, host0, 48, 1), (host0, dev0, 48, 2)]
    assert model.runs == 2 and model.copied_bytes == 112

    copies.clear()
    with use_lane(1):  # the second lane's own region of the slot and the bank
        model.run([{"INPUT0": np.ones((1, 2), np.float32)}])
    assert copies == [(dev0 + 64, host0 + 64, 8, 1), (host0 + 64, dev0 + 64, 8, 2)]
    with pytest.raises(ValueError, match="multiple of 4"):
        GpuIdentityModel(8, 0, slot_bytes=6)


class _Plan:
    """What the executor reads of a model on the GPU, standing in for a GpuPlanModel."""

    graph_count = 3

    class arena:
        @staticmethod
        def usage() -> dict[str, int]:
            return {"weights": 1024}

    def reset_padding(self) -> None:
        return None


@pytest.mark.parametrize("mode", ["device", "host"])
def test_a_gpu_executor_serves_builtins_on_the_device_unless_told_host(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loaded: list[tuple[str, str]] = []

    def fake_load(name: str, root: Path, max_batch: int, device: Any, gpu: dict[str, Any], lanes: int) -> Any:
        loaded.append((name, str(device)))
        return MlpModel(max_batch), _Plan()  # a model with the right spec; the device is not needed

    monkeypatch.setattr(gpu_builtins, "load_device_builtin", fake_load)
    ex = Executor.__new__(Executor)  # only _load's inputs: no sockets, no Redis
    ex.s = ExecutorSettings(artifact_dir=str(tmp_path), max_batch=8, gpu_builtins=mode)  # type: ignore[arg-type]
    ex.device = parse_device("cuda:1")
    ex._plans = {}
    served = ex._load("mlp")
    assert set(served) == {"mlp"}
    assert isinstance(ex._load("busy")["busy"], BusyModel)  # a sleep: always the host's
    if mode == "device":
        assert loaded == [("mlp", "cuda:1")] and isinstance(ex._plans["mlp"], _Plan)
    else:
        assert loaded == [] and ex._plans == {} and isinstance(served["mlp"], MlpModel)


def test_a_gpu_executor_starts_with_its_builtins_on_the_device(
    fake: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The whole start-up (CuPy faked): identity is GpuIdentityModel, mlp comes from the device loader
    (faked: no kernels are built here), busy stays on the host, each device model registered."""
    import sys

    from anvil_executor import service
    from anvil_executor.plan_runtime.gpu_identity import GpuIdentityModel

    sys.path.insert(0, str(Path(__file__).parent))
    from wire_helpers import executor_settings

    real = gpu_builtins.load_device_builtin

    def load(name: str, root: Path, max_batch: int, device: Any, gpu: dict[str, Any], lanes: int) -> Any:
        if name == "mlp":
            return MlpModel(max_batch), _Plan()
        return real(name, root, max_batch, device, gpu, lanes)

    monkeypatch.setattr(gpu_builtins, "load_device_builtin", load)
    monkeypatch.setattr(service, "open_device", lambda spec: "a faked device")
    extra = {"device": "cuda:0", "models": "identity,mlp,busy", "lanes": 2}
    settings = executor_settings("redis://127.0.0.1:1", tmp_path, "ex-gpu", **extra)
    ex = service.Executor(settings)
    try:
        assert isinstance(ex.models["identity"], GpuIdentityModel)
        assert isinstance(ex.models["busy"], BusyModel)
        assert set(ex._plans) == {"identity", "mlp"}
        out = ex.models["identity"].run([{"INPUT0": np.arange(6, dtype=np.float32).reshape(2, 3)}])
        np.testing.assert_array_equal(out[0]["OUTPUT0"], np.arange(6, dtype=np.float32).reshape(2, 3))
    finally:
        ex.ctx.destroy(linger=0)


def test_a_device_builtin_that_cannot_be_made_is_not_served_and_its_reload_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from anvil_executor.models.compiled import BuiltinUnavailable

    def fail(*args: Any) -> Any:
        raise BuiltinUnavailable("the compiler (anvil-compiler) is not installed next to this executor")

    monkeypatch.setattr(gpu_builtins, "load_device_builtin", fail)
    ex = Executor.__new__(Executor)
    ex.s = ExecutorSettings(artifact_dir=str(tmp_path), max_batch=8)
    ex.device = parse_device("cuda:0")
    ex._plans = {}
    ex.models = {}
    with caplog.at_level(logging.WARNING, logger="anvil.executor"):
        assert ex._load("mlp") == {}
    said = [r for r in caplog.records if r.getMessage() == "built-in model not served"]
    assert len(said) == 1 and "anvil-compiler" in said[0].__dict__["reason"]
    with pytest.raises(BuiltinUnavailable, match="mlp cannot be loaded here"):
        ex._reload_builtin("mlp")  # the loader logs it and retries with back-off
    assert ex._plans == {}
