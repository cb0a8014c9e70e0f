"""How an executor loads models onto its device: the built-ins at start-up (and again after an
unload), compiled artifacts when the registry places them here, each warmed up on every lane before it
is served; on a GPU each is registered for the device metrics and the steady-state allocation count.

A mixin of ``Executor`` (service.py), which owns the attributes it reads: ``s`` (settings),
``device``, ``models`` (the loader's served set) and ``_plans`` (model -> its plan on the GPU).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numba

from anvil_core.logs import get_logger
from anvil_executor import metrics as m
from anvil_executor.device import DeviceSpec
from anvil_executor.models import Model, gpu_builtins, load_builtin, minilm
from anvil_executor.models.builtin import BusyModel
from anvil_executor.models.compiled import BuiltinUnavailable
from anvil_executor.plan_runtime.lanes import use_lane
from anvil_executor.settings import ExecutorSettings
from anvil_executor.warmup import warm_up

__all__ = ["ModelLoading"]

log = get_logger("anvil.executor")
_ARTIFACT_ID = re.compile(r"[0-9a-f]{8,128}")


class ModelLoading:
    """The executor's model loading (module docstring)."""

    s: ExecutorSettings
    device: DeviceSpec
    models: dict[str, Model]
    _plans: dict[str, Any]

    def _set_compute_threads(self) -> None:
        """numba's thread count is per calling thread: each thread that runs models sets it."""
        if self.s.compute_threads > 0:
            numba.set_num_threads(min(self.s.compute_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]

    def _load(self, name: str) -> dict[str, Model]:
        """A built-in, warmed up, under each of its served names ({} when it cannot load here)."""
        if name == "busy":
            return {
                name: self._warm(BusyModel(self.s.max_batch, self.s.busy_base_us, self.s.busy_per_row_us))
            }
        on_device = self.device.is_cuda and self.s.gpu_builtins == "device"
        if name != minilm.SERVED_ID and not (on_device and name in gpu_builtins.DEVICE_BUILTINS):
            return {name: self._warm(load_builtin(name, self.s.max_batch))}  # numpy, on the host
        art = Path(self.s.builtin_artifact_dir or self.s.artifact_dir)
        mb, dev, gpu, lanes = self.s.max_batch, self.device, self._gpu_options(), self.s.lanes
        try:  # a compiled built-in (or identity's device round trip)
            if name == minilm.SERVED_ID:
                models, plan = minilm.load_minilm(art, mb, dev, gpu, lanes)
            else:
                model, plan = gpu_builtins.load_device_builtin(name, art, mb, dev, gpu, lanes)
                models = {name: model}
        except BuiltinUnavailable as exc:  # said once; the executor serves the others
            log.warning("built-in model not served", extra={"model": name, "reason": str(exc)})
            return {}
        self._warm(models[name])  # minilm's aliases share its model object
        if self.device.is_cuda:
            self._gpu_loaded(name, plan)
        return models

    def _reload_builtin(self, name: str) -> Model:
        """The loader's hook for a built-in that was unloaded and is loaded again (one served name;
        raises when it cannot load). MiniLM's other name, when still served, lends its model object."""
        self._set_compute_threads()  # a loader thread
        if name in minilm.NAMES:
            twin = next((self.models[n] for n in minilm.NAMES if n != name and n in self.models), None)
            if twin is not None:
                inner = twin.inner if isinstance(twin, minilm.AliasModel) else twin
                return inner if name == minilm.SERVED_ID else minilm.AliasModel(inner, name)
        models = self._load(minilm.SERVED_ID if name in minilm.NAMES else name)
        if not models:  # a compiled built-in that cannot be made here: the loader retries, with back-off
            raise BuiltinUnavailable(f"{name} cannot be loaded here (the log above says why)")
        return models[name]

    def _warm(self, model: Model) -> Model:
        """Every lane warmed up: each runs its own plan instance (a stateless model: the same runs)."""
        for lane in range(self.s.lanes):
            with use_lane(lane):
                warm_up(model, self.s.max_batch)
        return model

    def _load_artifact(self, name: str, artifact: str) -> Model:
        """Loader thread (numba warm-up is slow): a warm model of the artifact; raises on failure."""
        from anvil_executor.artifact import load_artifact

        self._set_compute_threads()  # a loader thread: numba's thread count is per thread
        if not _ARTIFACT_ID.fullmatch(artifact):  # a name from Redis, joined to a path: ids only
            raise ValueError(f"artifact id {artifact[:80]!r} is not a content hash (hex)")
        gpu = self._gpu_options()
        path = Path(self.s.artifact_dir) / artifact
        model, plan = load_artifact(path, self.device, name, gpu, self.s.lanes)
        self._warm(model)  # before the steady-state mark: its first runs may touch memory
        if self.device.is_cuda:
            self._gpu_loaded(name, plan)
        return model

    def _gpu_options(self) -> dict[str, Any]:
        """GpuPlanModel options from the settings (ignored on the CPU)."""
        return {
            "gemm": self.s.gpu_gemm,
            "tf32": self.s.gpu_tf32,
            "precision": self.s.gpu_precision,
            "lt_epilogue": self.s.gpu_lt_epilogue,
            "pdl": self.s.gpu_pdl,
            "sync": self.s.gpu_sync,
        }

    def _gpu_loaded(self, name: str, plan: Any) -> None:
        """A model now on the GPU: its graphs and device banks exported, its plan's run phases and
        padding read at each scrape, and the steady state marked (after its warm-up)."""
        from anvil_executor.plan_runtime.cuda_arena import counter

        self._plans[name] = plan
        m.graphs.labels(model=name).set(plan.graph_count)
        for bank, size in plan.arena.usage().items():
            m.device_bytes.labels(model=name, bank=bank).set(size)
        plan.reset_padding()  # padding is reported for served batches, not warm-up
        counter.mark_steady()  # loads are done: what follows must allocate nothing

    def _device_metrics(self) -> None:
        if not self.device.is_cuda:
            return
        from anvil_executor.plan_runtime.cuda_arena import counter

        m.device_allocations.set(counter.steady_allocations)
        m.module_loads.set(counter.steady_module_loads)
        for name, plan in list(self._plans.items()):
            m.padding_waste.labels(model=name).set(plan.padding_waste)
