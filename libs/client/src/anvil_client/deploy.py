"""`anvil deploy`, `anvil undeploy` and `anvil models`: compile a model through the compiler
service, serve it, switch versions, remove it.

    anvil deploy model.onnx --name m [--group 128] [--arch sm_90] [--max-batch 8] [--max-seq 128]
    anvil deploy path/to/hf_dir --name minilm            # config.json + model.safetensors
    anvil deploy path/to/hf_dir --name minilm --gptq [--act-order] --group 32 [--keep-fp32 PAT]
    anvil deploy model.onnx --name m --max-rel-error 0.2      # error budget; `none`: report only
    anvil deploy model.onnx --name m --calibration-data inputs.npz   # the report's inputs
    anvil deploy model.onnx --name m --device 'cuda:*' --wait # placement; return once it serves
    anvil undeploy m [--version 2] [--wait]
    anvil models

Deploy uploads the model to ``POST /v1/compile``, follows the job with a progress bar, then adds
the artifact to the model's repository as a new version and makes it the served one
(``anvil_core.deployments``: ``anvil:model:{name}`` status COMPILED, ``anvil:versions:{name}``) and
publishes ``model_deployed`` on ``anvil:events``. The executors that the placement names load the
artifact, warm it up, switch to it, and set the status to READY; the version served before
answers until then. Undeploy marks the model UNLOADED (or, for ``--version``, removes that version
and serves the highest one left): executors unload it, the scheduler answers its queued requests
with an error, the gateway answers 404.

Deploy prints the compiler's accuracy report (the quantized plan against the unquantized one: max
and mean relative error, cosine, the linears kept fp32 to meet ``--max-rel-error``). A compile
that fails (an unmeetable error budget included) registers nothing: the version already
deployed under the name keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, cast

from anvil_client.stack_redis import compiler_key, redis_target
from anvil_core import keys
from anvil_core.registry import connect_redis

__all__ = [
    "add_deploy_commands",
    "cmd_deploy",
    "cmd_models",
    "cmd_undeploy",
    "format_accuracy",
    "hf_bundle",
    "register",
    "wait_served",
]


def hf_bundle(path: Path) -> bytes:
    """The compiler's upload format of a checkpoint dir (``anvil_core.hf_bundle``): the weights,
    config and, where present, the tokenizer and sentence-transformers configs."""
    from anvil_core.hf_bundle import pack_dir

    return pack_dir(path)


def add_deploy_commands(subparsers: Any) -> None:
    compiler = os.environ.get("ANVIL_COMPILER_URL", "http://127.0.0.1:8010")
    redis_url = None  # anvil_client.stack_redis: ANVIL_REDIS_URL, else the running stack's
    d = subparsers.add_parser(
        "deploy", help="compile a model (ONNX file or HF dir) and serve it as a new version"
    )
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
        "--gpu-precision",
        choices=("auto", "fp16", "bf16", "fp32"),
        default="auto",
        help="activations on a GPU executor: fp16 (cuBLAS fp16 / W4A16, fp32 accumulation), bf16 (the same "
        "in bf16: fp32's range, for activations that overflow fp16), fp32 (TF32), auto = fp16 for "
        "encoders, fp32 otherwise; the CPU runs fp32 either way",
    )
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
    d.add_argument(
        "--version",
        default=None,
        help="version to deploy as (default: one above the highest); the previous version serves "
        "until this one is loaded and warm, then every executor switches over",
    )
    d.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="PATTERN",
        help="placement: only executors whose device matches load it (cpu, cuda:0, 'cuda:*'); "
        "repeatable; default: every executor",
    )
    d.add_argument(
        "--executor",
        action="append",
        default=[],
        metavar="PATTERN",
        help="placement: only executors whose service id matches load it; repeatable",
    )
    d.add_argument("--wait", action="store_true", help="return once an executor serves the new version")
    d.add_argument("--compiler", default=compiler, help="compiler URL (env ANVIL_COMPILER_URL)")
    d.add_argument(
        "--api-key",
        default=None,
        help="the compiler's API key (default: env ANVIL_COMPILER_API_KEY, else the running `anvil up` "
        "stack's, else ANVIL_SECRET_COMPILER_API_KEY of ./.env, else env ANVIL_API_KEY)",
    )
    d.add_argument("--redis-url", default=redis_url, help="env ANVIL_REDIS_URL")
    d.add_argument("--timeout-s", type=float, default=900.0, help="for the compile, and for --wait")
    d.set_defaults(fn=cmd_deploy)
    u = subparsers.add_parser(
        "undeploy",
        help="remove a model (or one version) from the registry: executors unload it, requests "
        "queued for it are answered with an error, the gateway answers 404",
    )
    u.add_argument("name", help="the model's name (as deployed)")
    u.add_argument(
        "--version",
        default=None,
        help="remove only this version; if it is the served one, the highest version left serves",
    )
    u.add_argument("--wait", action="store_true", help="return once no executor serves it")
    u.add_argument("--redis-url", default=redis_url, help="env ANVIL_REDIS_URL")
    u.add_argument("--timeout-s", type=float, default=60.0, help="for --wait")
    u.set_defaults(fn=cmd_undeploy)
    m = subparsers.add_parser("models", help="list deployed models, their versions and status")
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
        "gpu_precision": getattr(args, "gpu_precision", "auto"),
    }
    budget = getattr(args, "max_rel_error", None)
    if budget is not None:  # absent: the compiler's default budget (declared once, CompileOptions)
        opts["max_rel_error"] = None if budget == "none" else budget
    return opts


def format_gpu(stats: dict[str, Any]) -> str:
    """The line `anvil deploy` prints for how a GPU executor runs the plan (the compiler's record)."""
    precision = stats.get("gpu_precision")
    if not precision:
        return ""  # an artifact of a compiler before GPU precisions
    backends = ", ".join(f"{n} {b}" for b, n in sorted(stats.get("gpu_linear_backends", {}).items()))
    line = f"on a GPU: {precision} activations; linears: {backends or 'none'}"
    if stats.get("w4a16_module"):
        line += f" (W4A16 kernels {stats['w4a16_module']})"
    return line


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
    key = getattr(args, "api_key", None) or compiler_key(args.compiler)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    import httpx  # here: `anvil up` builds this parser, never uploads (httpx: ~0.5 s of import)

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


def register(
    redis_url: str | None,
    name: str,
    manifest: dict[str, Any],
    artifact_root: str = "",
    version: str | None = None,
    placement: dict[str, list[str]] | None = None,
) -> str:
    """Add the compiled artifact to the model's repository and serve it (``anvil_core.deployments``);
    returns the version."""
    from anvil_core import deployments

    artifact_dir = str(Path(artifact_root) / manifest["id"]) if artifact_root else ""

    async def run() -> str:
        redis = connect_redis(*redis_target(redis_url))
        try:
            return await deployments.deploy(
                redis, name, manifest["id"], manifest["spec"], artifact_dir, version, placement
            )
        finally:
            await redis.aclose()

    return asyncio.run(run())


def _placement(args: argparse.Namespace) -> dict[str, list[str]]:
    out = {}
    if getattr(args, "device", None):
        out["devices"] = list(args.device)
    if getattr(args, "executor", None):
        out["executors"] = list(args.executor)
    return out


def wait_served(redis_url: str | None, name: str, version: str | None, timeout_s: float) -> str:
    """Poll the registry until ``name`` (at ``version``; None: gone) is served by an executor (or
    served by none). Returns "" when it is, else why not (a load error an executor reports, or
    the time it waited)."""
    from anvil_core import deployments

    async def run() -> str:
        redis = connect_redis(*redis_target(redis_url))
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                execs = [
                    cast(dict[str, str], await redis.hgetall(k))  # a decode_responses client
                    async for k in redis.scan_iter(match=keys.svc_pattern("executor"))
                ]
                serving = [e for e in execs if name in json.loads(e.get("models", "[]") or "[]")]
                dep = await deployments.read(redis, name)
                if version is None and not serving:
                    return ""
                if (
                    version is not None
                    and dep is not None
                    and (dep.status, dep.version) == ("READY", version)
                ):
                    return ""
                errors = [json.loads(e.get("load_errors", "{}") or "{}").get(name) for e in execs]
                failing = [f"{e.get('id', '?')}: {err}" for e, err in zip(execs, errors, strict=True) if err]
                if failing and version is not None:
                    return "executors cannot load it: " + "; ".join(failing)
                if (
                    version is not None
                    and dep is not None
                    and execs
                    and not any(
                        deployments.placement_allows(dep.placement, e.get("device", ""), e.get("id", ""))
                        for e in execs
                    )
                ):
                    return f"no registered executor matches its placement {dep.placement}"
                if time.monotonic() > deadline:
                    return f"not done after {timeout_s:.0f} s"
                await asyncio.sleep(0.2)
        finally:
            await redis.aclose()

    return asyncio.run(run())


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
    try:
        version = register(
            args.redis_url,
            args.name,
            manifest,
            os.environ.get("ANVIL_ARTIFACT_DIR", ""),
            args.version,
            _placement(args),
        )
    except ValueError as exc:
        print(f"anvil: {exc}")
        return 2
    stats = manifest["stats"]
    print(
        f"deployed {args.name} version {version}: artifact {manifest['id']}"
        f"{' (cached)' if job['cached'] else ''}, "
        f"{stats['kernels']} kernels, activations {stats['activation_bytes'] / 2**20:.1f} MiB, "
        f"weights {stats['weight_bytes'] / 2**20:.1f} MiB"
    )
    for line in format_accuracy(manifest.get("accuracy")):
        print(line)
    gpu = format_gpu(stats)
    if gpu:
        print(gpu)
    if args.wait:
        why = wait_served(args.redis_url, args.name, version, args.timeout_s)
        if why:
            print(f"{args.name} version {version} does not serve: {why}")
            return 1
        print(f"{args.name} version {version} serves (READY)")
    return 0


def cmd_undeploy(args: argparse.Namespace) -> int:
    from anvil_core import deployments

    async def run() -> str:
        redis = connect_redis(*redis_target(args.redis_url))
        try:
            return await deployments.undeploy(redis, args.name, args.version)
        finally:
            await redis.aclose()

    try:
        print(asyncio.run(run()))
    except deployments.RepositoryError as exc:
        print(f"anvil: {exc}")
        return 1
    if args.wait and args.version is None:
        why = wait_served(args.redis_url, args.name, None, args.timeout_s)
        if why:
            print(f"executors still serve {args.name}: {why}")
            return 1
        print(f"no executor serves {args.name} any more")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from anvil_core import deployments

    async def read() -> dict[str, deployments.Deployment]:
        redis = connect_redis(*redis_target(args.redis_url))
        try:
            return await deployments.snapshot(redis)
        finally:
            await redis.aclose()

    table = Table("model", "version", "status", "artifact", "placement", "versions", "inputs")
    for name, dep in asyncio.run(read()).items():
        try:
            spec = json.loads(dep.spec or "{}")
        except json.JSONDecodeError:
            spec = {}
        ins = ", ".join(f"{t['name']}{t['dims']}" for t in spec.get("inputs", []) if isinstance(t, dict))
        status = dep.status or "-"
        if dep.status == deployments.UNLOADED and dep.reason:
            status += f" ({dep.reason})"
        table.add_row(
            name,
            dep.version or "-",
            status,
            dep.artifact or "-",
            json.dumps(dep.placement) if dep.placement else "all",
            ", ".join(dep.versions) or "-",
            ins,
        )
    Console().print(table)
    return 0
