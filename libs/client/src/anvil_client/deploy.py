"""`anvil deploy` and `anvil models`: compile a model through the compiler service and register it.

    anvil deploy model.onnx --name m [--group 128] [--arch sm_90] [--max-batch 8] [--max-seq 128]
    anvil deploy path/to/hf_dir --name minilm            # config.json + model.safetensors
    anvil deploy path/to/hf_dir --name minilm --gptq [--act-order] --group 32 [--keep-fp32 PAT]
    anvil deploy model.onnx --name m --max-rel-error 0.2      # error budget; `none`: report only
    anvil deploy model.onnx --name m --calibration-data inputs.npz   # the report's inputs
    anvil models

Deploy uploads the model to ``POST /v1/compile``, follows the job with a progress bar, then writes
``anvil:model:{name}`` (``spec``: the ModelSpec JSON the gateway validates with, ``status``:
COMPILED, ``artifact``: the artifact id, ``artifact_dir``) and publishes
``{"event": "model_deployed", "model": name, "artifact": id}`` on ``anvil:events``; executors load
the artifact, warm it up, and then set the status to READY.

Deploy prints the compiler's accuracy report (the quantized plan against the unquantized one: max
and mean relative error, cosine, the linears kept fp32 to meet ``--max-rel-error``). A compile
that fails (an unmeetable error budget included) registers nothing: the version already
deployed under the name keeps serving.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from anvil_core import keys

__all__ = ["add_deploy_commands", "cmd_deploy", "cmd_models", "format_accuracy", "hf_bundle"]


def hf_bundle(path: Path) -> bytes:
    """The compiler's upload format of a checkpoint dir (``anvil_core.hf_bundle``): the weights,
    config and, where present, the tokenizer and sentence-transformers configs."""
    from anvil_core.hf_bundle import pack_dir

    return pack_dir(path)


def add_deploy_commands(subparsers: Any) -> None:
    compiler = os.environ.get("ANVIL_COMPILER_URL", "http://127.0.0.1:8010")
    redis_url = os.environ.get("ANVIL_REDIS_URL", "redis://127.0.0.1:6379/0")
    d = subparsers.add_parser("deploy", help="compile a model (ONNX file or HF dir) and register it")
    d.add_argument("model", type=Path)
    d.add_argument("--name", required=True)
    d.add_argument("--group", type=int, default=128, help="INT4 group size (32, 64, 128, 256)")
    d.add_argument("--arch", action="append", default=None, help="GPU arch, repeatable (default sm_90)")
    d.add_argument("--max-batch", type=int, default=8)
    d.add_argument("--max-seq", type=int, default=128)
    d.add_argument("--unquantized", action="store_true", help="keep every weight fp32")
    d.add_argument("--clip-search", action="store_true", help="search clipping ratios per INT4 group")
    d.add_argument(
        "--gptq",
        action="store_true",
        help="GPTQ instead of round-to-nearest (BERT uncased vocabularies; docs/compiler.md)",
    )
    d.add_argument("--calibration", default="bert-uncased", help="GPTQ calibration set")
    d.add_argument("--act-order", action="store_true", help="GPTQ: rows by decreasing input energy")
    d.add_argument("--keep-fp32", action="append", default=[], help="node-name pattern kept fp32, repeatable")
    d.add_argument(
        "--max-rel-error",
        type=_budget,
        default=None,
        metavar="X|none",
        help="error budget: largest relative max-norm output error vs the unquantized plan; linears "
        "are kept fp32 until it fits (default: the compiler's, 0.05); none: report only",
    )
    d.add_argument(
        "--calibration-data",
        type=Path,
        default=None,
        metavar="NPZ",
        help="inputs the accuracy report and error budget run on: numpy .npz, one array per model "
        "input (rows along axis 0); default: the model's calibration set or generated inputs",
    )
    d.add_argument("--compiler", default=compiler, help="compiler URL (env ANVIL_COMPILER_URL)")
    d.add_argument(
        "--api-key",
        default=None,
        help="the compiler's API key (default: env ANVIL_COMPILER_API_KEY, else ANVIL_API_KEY)",
    )
    d.add_argument("--redis-url", default=redis_url, help="env ANVIL_REDIS_URL")
    d.add_argument("--timeout-s", type=float, default=900.0)
    d.set_defaults(fn=cmd_deploy)
    m = subparsers.add_parser("models", help="list deployed models and their status")
    m.add_argument("--redis-url", default=redis_url)
    m.set_defaults(fn=cmd_models)


def _budget(text: str) -> float | str:
    if text.lower() in ("none", "off"):
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a number > 0 or 'none', got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"wants a number > 0 or 'none', got {text!r}")
    return value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "group_size": args.group,
        "archs": args.arch or ["sm_90"],
        "max_batch": args.max_batch,
        "max_seq": args.max_seq,
        "quantize": not args.unquantized,
        "clip_search": args.clip_search,
        "gptq": args.gptq,
        "calibration": args.calibration,
        "act_order": args.act_order,
        "keep_fp32": args.keep_fp32,
    }
    budget = getattr(args, "max_rel_error", None)
    if budget is not None:  # absent: the compiler's default budget (declared once, CompileOptions)
        opts["max_rel_error"] = None if budget == "none" else budget
    return opts


def format_accuracy(accuracy: dict[str, Any] | None) -> list[str]:
    """The lines `anvil deploy` prints for a manifest's accuracy report."""
    if not accuracy:
        return ["accuracy: nothing quantized (the plan is the fp32 reference)"]
    budget = accuracy.get("budget")
    lines = [f"accuracy vs the unquantized plan, on {accuracy['inputs']}:"]
    for o in accuracy["outputs"]:
        lines.append(
            f"  {o['name']}: max rel error {o['max_rel']:.4f}, mean {o['mean_rel']:.4f}, "
            f"cosine min {o['cos_min']:.6f} mean {o['cos_mean']:.6f}"
        )
    n_int4, kept = len(accuracy["int4_linears"]), accuracy["kept_fp32"]
    within = "report only, no budget" if budget is None else f"budget {budget:g}"
    lines.append(f"  max rel error {accuracy['max_rel']:.4f} ({within}); {n_int4} linears INT4")
    if kept:
        sens = accuracy.get("sensitivity", {})
        lines.append(
            f"  all-INT4 error was {accuracy['all_int4_max_rel']:.4f}: kept fp32, most sensitive first: "
            + ", ".join(f"{k} ({sens[k]:.3f})" if k in sens else k for k in kept)
        )
    return lines


def compile_remote(args: argparse.Namespace, on_progress: Any = None) -> dict[str, Any]:
    """Upload, follow the job to its end; returns the final job document."""
    path: Path = args.model
    fmt, data = ("hf", hf_bundle(path)) if path.is_dir() else ("onnx", path.read_bytes())
    key = (
        getattr(args, "api_key", None)
        or os.environ.get("ANVIL_COMPILER_API_KEY")
        or os.environ.get("ANVIL_API_KEY")
    )
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=args.compiler, timeout=60, headers=headers) as http:
        files = {"file": (path.name, data)}
        calib: Path | None = getattr(args, "calibration_data", None)
        if calib is not None:
            files["calibration"] = (calib.name, calib.read_bytes())
        r = http.post(
            "/v1/compile",
            files=files,
            data={"name": args.name, "format": fmt, "options": json.dumps(_options(args))},
        )
        if r.status_code != 200:
            raise SystemExit(f"compile request refused ({r.status_code}): {r.text}")
        job: dict[str, Any] = r.json()
        deadline = time.monotonic() + args.timeout_s
        while job["status"] not in ("done", "failed"):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job['id']} still {job['status']} after {args.timeout_s} s")
            time.sleep(0.2)
            job = http.get(f"/v1/jobs/{job['id']}").json()
            if on_progress:
                on_progress(job)
        if job["status"] == "done":
            job["manifest"] = http.get(f"/v1/artifacts/{job['artifact_id']}").json()
    return job


def register(redis_url: str, name: str, manifest: dict[str, Any], artifact_root: str = "") -> None:
    import redis

    spec = dict(manifest["spec"], name=name)
    r = redis.Redis.from_url(redis_url)
    try:
        r.hset(
            keys.model_key(name),
            mapping={
                "spec": json.dumps(spec),
                "status": "COMPILED",
                "artifact": manifest["id"],
                "artifact_dir": str(Path(artifact_root) / manifest["id"]) if artifact_root else "",
            },
        )
        r.publish(
            keys.EVENTS,
            json.dumps(
                {"event": "model_deployed", "model": name, "artifact": manifest["id"], "ts": time.time()}
            ),
        )
    finally:
        r.close()


def cmd_deploy(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    ) as bar:
        task = bar.add_task(f"compiling {args.name}", total=100)

        def show(job: dict[str, Any]) -> None:
            bar.update(task, completed=job["percent"], description=f"{args.name}: {job['stage']}")

        job = compile_remote(args, show)
        bar.update(task, completed=100 if job["status"] == "done" else job["percent"])
    if job["status"] == "failed":
        print(f"compile failed at {job['error_stage']}: {job['error']}")
        if job.get("detail"):
            print(job["detail"])
        return 1
    manifest = job["manifest"]
    register(args.redis_url, args.name, manifest, os.environ.get("ANVIL_ARTIFACT_DIR", ""))
    stats = manifest["stats"]
    print(
        f"deployed {args.name}: artifact {manifest['id']}{' (cached)' if job['cached'] else ''}, "
        f"{stats['kernels']} kernels, activations {stats['activation_bytes'] / 2**20:.1f} MiB, "
        f"weights {stats['weight_bytes'] / 2**20:.1f} MiB"
    )
    for line in format_accuracy(manifest.get("accuracy")):
        print(line)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    import redis
    from rich.console import Console
    from rich.table import Table

    r: Any = redis.Redis.from_url(args.redis_url, decode_responses=True)
    table = Table("model", "status", "artifact", "inputs")
    try:
        for key in sorted(r.scan_iter(keys.model_key("*"))):
            doc = r.hgetall(key)
            spec = json.loads(doc.get("spec", "{}") or "{}")
            ins = ", ".join(f"{t['name']}{t['dims']}" for t in spec.get("inputs", []))
            table.add_row(
                key.removeprefix(keys.model_key("")), doc.get("status", "?"), doc.get("artifact", "-"), ins
            )
    finally:
        r.close()
    Console().print(table)
    return 0
