"""GPU executors under `anvil up`: one per GPU, on the visible GPUs narrowed by ANVIL_GPUS.

Visible: CUDA_VISIBLE_DEVICES when it is set (CUDA numbers the listed devices 0..n-1 for every
process that inherits it, and the executors do), else the `GPU N:` lines of `nvidia-smi -L`. MIG
instances are not counted separately: an executor gets a whole GPU.

ANVIL_GPUS: `all` (the default) or a comma-separated list of indices into the visible GPUs, e.g.
`0,1` or `1`. Executor i then runs with ANVIL_DEVICE=cuda:i.

ANVIL_EXECUTORS_PER_GPU: executor processes per selected GPU, 1 to 8, or `auto` (the default): one
per 4 CPU cores of the host, at most 4 (4 on a 16-core host, 1 on 2-7 cores). An executor's Python
work (decoding, tokenization, staging, splitting results) runs mostly on one core; where that, not
the GPU, bounds a model (docs/executor_gpu.md), several processes share the GPU, each with its own
arena and graphs (device memory times N), and the scheduler balances batches across them as across
GPUs. Measured on the H200 host (16 cores, bench/results/gpu_scale.md): MiniLM at c16 1 -> 2 -> 4
executors 18.2k -> 23.0k -> 28.1k sentences/s.

compose.yaml marks its GPU executor services `x-anvil-per-gpu` (containers need one per GPU, each
seeing its GPU as cuda:0); `per_gpu_services` turns them into the launcher's one per selected GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from anvil_client.compose_file import ServiceDef

__all__ = [
    "GpuSelectionError",
    "Visible",
    "executors_per_gpu",
    "nvidia_smi_gpus",
    "per_gpu_services",
    "select_gpus",
    "visible_gpus",
]

MAX_EXECUTORS_PER_GPU = 8  # each holds its own arena and CUDA graphs on the device
AUTO_MAX_EXECUTORS_PER_GPU = 4  # `auto`'s ceiling: the most measured (bench/results/gpu_scale.md)
CORES_PER_EXECUTOR = 4  # `auto`: an executor's own threads plus its share of gateway and scheduler
SMI_TIMEOUT_S = 10.0  # `nvidia-smi -L` answers in ~50 ms; this only bounds a wedged driver


class GpuSelectionError(ValueError):
    """ANVIL_GPUS cannot be satisfied (or the per-GPU services disagree); the message states the
    constraint and what is visible."""


@dataclass(frozen=True)
class Visible:
    count: int | None  # None: nothing could be asked (no nvidia-smi, CUDA_VISIBLE_DEVICES unset)
    source: str  # where the count came from, for messages: `nvidia-smi -L`, `CUDA_VISIBLE_DEVICES=...`


def nvidia_smi_gpus(env: Mapping[str, str]) -> list[str] | None:
    """The `GPU N: ...` lines of `nvidia-smi -L` (found on env's PATH), or None when it is absent or fails."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def executors_per_gpu(spec: str | None, cpus: int | None = None) -> int:
    """ANVIL_EXECUTORS_PER_GPU as a count; unset or `auto`: one per CORES_PER_EXECUTOR of ``cpus``
    (default: this host's), between 1 and AUTO_MAX_EXECUTORS_PER_GPU. GpuSelectionError for anything
    but `auto` or a whole number from 1 to 8."""
    spec = (spec or "").strip() or "auto"
    if spec == "auto":
        cores = cpus if cpus is not None else (os.cpu_count() or 1)
        return max(1, min(AUTO_MAX_EXECUTORS_PER_GPU, cores // CORES_PER_EXECUTOR))
    if not _is_index(spec) or not 1 <= int(spec) <= MAX_EXECUTORS_PER_GPU:
        raise GpuSelectionError(
            f"ANVIL_EXECUTORS_PER_GPU={spec!r}: expected `auto` or a whole number "
            f"from 1 to {MAX_EXECUTORS_PER_GPU}"
        )
    return int(spec)


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _cuda_visible_count(value: str) -> int:
    """How many devices CUDA exposes for this CUDA_VISIBLE_DEVICES: the entries up to the first one
    that is neither an index nor a `GPU-`/`MIG-` UUID (CUDA ignores the rest; `-1` and `` hide all)."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not (_is_index(entry) or entry.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def visible_gpus(env: Mapping[str, str]) -> Visible:
    if "CUDA_VISIBLE_DEVICES" in env:
        value = env["CUDA_VISIBLE_DEVICES"]
        return Visible(_cuda_visible_count(value), f"CUDA_VISIBLE_DEVICES={value!r}")
    lines = nvidia_smi_gpus(env)
    if lines is None:
        return Visible(None, "no nvidia-smi on PATH and CUDA_VISIBLE_DEVICES unset")
    return Visible(len(lines), "nvidia-smi -L")


def select_gpus(spec: str | None, visible: Visible) -> list[int]:
    """The visible-GPU indices ANVIL_GPUS (`spec`) names, ascending; raises GpuSelectionError.

    Explicit indices are trusted when nothing could be asked (visible.count is None): a host may
    have GPUs and no nvidia-smi. `all` then has nothing to expand to and is refused.
    """
    spec = (spec or "").strip() or "all"
    if spec == "all":
        if not visible.count:
            found = "none" if visible.count == 0 else "unknown"
            raise GpuSelectionError(
                f"no GPU to start executors on (visible GPUs: {found}; {visible.source}); "
                "name them with ANVIL_GPUS=0,1 or run the CPU stack with ANVIL_PROFILES=cpu"
            )
        return list(range(visible.count))
    indices: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not _is_index(item):
            raise GpuSelectionError(
                f"ANVIL_GPUS={spec!r}: expected 'all' or comma-separated GPU indices such as '0,1' "
                f"(indices of the visible GPUs, from 0); {item!r} is not an index"
            )
        index = int(item)
        if index in indices:
            raise GpuSelectionError(f"ANVIL_GPUS={spec!r}: GPU {index} is listed twice")
        if visible.count is not None and index >= visible.count:
            seen = f"indices 0..{visible.count - 1}" if visible.count else "none visible"
            raise GpuSelectionError(
                f"ANVIL_GPUS={spec!r}: GPU {index} is not visible ({seen}; {visible.source})"
            )
        indices.append(index)
    return sorted(indices)


def per_gpu_services(
    services: Mapping[str, ServiceDef],
    env: Mapping[str, str],
    scale: Mapping[str, int],
    port_stride: int,
    say: Callable[[str], None] = print,
) -> dict[str, ServiceDef]:
    """`services` with the `x-anvil-per-gpu` ones replaced by one copy of the first per selected
    GPU, in its place: `<name without trailing digits><i>` (executor-gpu0 -> executor-gpu1, ...) with
    ANVIL_DEVICE=cuda:<i> and metrics port + port_stride x i. The other marked services are the
    containers' copies of the same executor; they must not differ from the first."""
    marked = [s for s in services.values() if s.per_gpu]
    if not marked:
        if env.get("ANVIL_GPUS"):
            say(f"anvil: ANVIL_GPUS={env['ANVIL_GPUS']!r} ignored: no per-GPU executor in these profiles")
        return dict(services)
    template = marked[0]
    for svc in marked:
        if scale.get(svc.name, 1) != 1:
            raise GpuSelectionError(
                f"--scale {svc.name}: GPU executors run one per GPU; choose the GPUs with ANVIL_GPUS"
            )
        keys = template.environment.keys() | svc.environment.keys()
        differs = sorted(k for k in keys if template.environment.get(k) != svc.environment.get(k))
        if svc.command != template.command:
            differs.insert(0, "command")
        if differs:
            raise GpuSelectionError(
                f"{svc.name} and {template.name} are both x-anvil-per-gpu but differ in "
                f"{', '.join(differs)}; they must describe the same executor (the launcher runs the first)"
            )
    visible = visible_gpus(env)
    gpus = select_gpus(env.get("ANVIL_GPUS"), visible)
    per_gpu = executors_per_gpu(env.get("ANVIL_EXECUTORS_PER_GPU"))
    seen = "unknown" if visible.count is None else str(visible.count)
    each = "one executor" if per_gpu == 1 else f"{per_gpu} executors"
    say(
        f"anvil: GPUs visible: {seen} ({visible.source}); ANVIL_GPUS={env.get('ANVIL_GPUS') or 'all'}: "
        f"{each} on each of {', '.join(f'cuda:{i}' for i in gpus)}"
    )
    stem = template.name.rstrip("0123456789")
    base_port = template.environment.get("ANVIL_METRICS_PORT")
    if base_port is not None and not _is_index(base_port):
        raise GpuSelectionError(f"{template.name}: ANVIL_METRICS_PORT={base_port!r} is not a port number")
    out: dict[str, ServiceDef] = {}
    for name, svc in services.items():
        if svc is template:
            for i in gpus:
                for j in range(per_gpu):  # executor-gpu0, then executor-gpu0.1, ... on the same GPU
                    svc_env = {**svc.environment, "ANVIL_DEVICE": f"cuda:{i}"}
                    if base_port:
                        svc_env["ANVIL_METRICS_PORT"] = str(int(base_port) + port_stride * (i * per_gpu + j))
                    copy = f"{stem}{i}" if j == 0 else f"{stem}{i}.{j}"
                    out[copy] = replace(svc, name=copy, environment=svc_env)
        elif not svc.per_gpu:
            out[name] = svc
    return out
