"""Every op's output of one GPU batch, op by op: where a GPU plan departs from its CPU twin.

``trace(model, reqs)`` stages the requests as a batch would be (same bucket), then launches the ops one
at a time (eager, no graph), synchronizing after each and copying its output to the host as fp32
before a later op can reuse the memory. The GPU tests print the first op whose output diverges from
the CPU runtime's (tests/test_gpu_fp16.py) when a cosine bound fails. Diagnostic only: it allocates
host arrays and synchronizes per op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anvil_executor.models.base import RequestInputs
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import _s
from anvil_executor.plan_runtime.precision import to_f32

__all__ = ["trace"]


def trace(model: Any, reqs: list[RequestInputs]) -> tuple[tuple[int, int], list[tuple[str, str, np.ndarray]]]:
    """((B, T) bucket, [(op name, op kind, output (bucket shape) fp32)]) of ``model`` (GpuPlanModel)."""
    cp = model._cp
    p = model.plan.plan
    lens = model._lens(reqs)
    b, t = model._stage(reqs, lens, max(lens))
    out: list[tuple[str, str, np.ndarray]] = []
    with cp.cuda.Device(model.device_id), model.stream:
        model._copy_in(b, t)
        for i, launch in enumerate(model._launches(b, t)):
            model._run_op(i, launch, b, t)
            model.stream.synchronize()
            o = int(_l(p.ops[i].outputs)[0])
            view = model.arena.view(
                "activations", int(p.tensors[o].offset), model.plan.shape(o, b, t), model._dtypes[o]
            )
            out.append((_s(p.ops[i].name), _s(p.ops[i].kind), to_f32(cp.asnumpy(view)).astype(np.float32)))
    return (b, t), out
