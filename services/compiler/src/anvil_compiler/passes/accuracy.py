"""Accuracy of a quantized plan against the unquantized plan, and the error budget.

The fused graph runs twice per input batch in the compiler's evaluator (`forward.py`): with its
fp32 constants (the unquantized plan) and with the weights the plan will store (INT4 linears
dequantized, fp16 embedding tables rounded). Per output and input row (masked-out tokens zeroed
in both), the error is the relative max-norm ``max|q - ref| / max|ref|``; the report gives its
max and mean over rows and the per-row cosine (the measure that matters for embeddings).

Inputs, first that applies: calibration data uploaded with the model (``.npz``, one array per
graph input, rows along axis 0; `read_calibration`); the model's own calibration set (a token-id
model whose vocabulary is that of ``opts.calibration``: every k-th sample, lengths spread, at most
``max_seq`` tokens); generated inputs of the declared shapes with a fixed seed: N(0, 1) floats,
token ids uniform over the embedding table, masks with random valid lengths, other integers 0.

Budget (``opts.max_rel_error``): when the all-INT4 error is over it, each INT4 linear's
sensitivity is measured (the error with only that linear quantized), and linears are kept fp32,
most sensitive first, until the error fits. If it still does not with every linear fp32 (what
is left is fp16 embedding rounding), the compile fails with the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Graph
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.calibrate import (
    CALIBRATIONS,
    calibration_batches,
    calibration_feeds,
    calibration_ids,
)
from anvil_compiler.passes.forward import run_graph
from anvil_compiler.passes.quantize import OpWeights, fp32_linear
from anvil_kernels import Int4Weight, dequantize

__all__ = [
    "AccuracyReport",
    "Calibration",
    "OutputError",
    "check_accuracy",
    "eval_inputs",
    "read_calibration",
]

SEED = 0  # generated inputs: the same draw on every compile of a model
GENERATED_ROWS = 64  # rows of generated inputs (one batch; the evaluator has no batch limit)
GENERATED_SEQ = 32  # tokens per generated row of a sequence model (capped by max_seq)
CALIBRATION_SAMPLES = 24  # samples of a calibration set (MiniLM: ~1,000 tokens, ~0.5 s a run)
MAX_UPLOADED_ROWS = 1024  # rows of uploaded calibration data used (the first ones)

Calibration = dict[str, np.ndarray]  # graph input name -> (rows, ...) array


@dataclass(frozen=True, slots=True)
class OutputError:
    name: str
    max_rel: float  # max over rows of max|q - ref| / max|ref|
    mean_rel: float  # mean over rows of the same
    cos_min: float  # per-row cosine of q and ref: min and mean
    cos_mean: float


@dataclass(slots=True)
class AccuracyReport:
    inputs: str  # where the inputs came from
    rows: int
    budget: float | None
    outputs: list[OutputError]
    all_int4_max_rel: float  # before any layer was kept for the budget
    int4_linears: list[str]  # INT4 in the final plan
    kept_fp32: list[str] = field(default_factory=list)  # kept by the budget, most sensitive first
    sensitivity: dict[str, float] = field(default_factory=dict)  # linear -> max_rel alone INT4

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def mean_rel(self) -> float:
        return max((o.mean_rel for o in self.outputs), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_rel"], d["mean_rel"] = self.max_rel, self.mean_rel
        return d


def _feeds_of(g: Graph, rows: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    cons = g.consumers()
    lengths = rng.integers(max(1, seq // 4), seq + 1, rows)
    lengths[0] = seq  # one full row, so the longest sequence is exercised
    out: dict[str, np.ndarray] = {}
    for name in g.inputs:
        t = g.types[name]
        shape = tuple(d.eval(rows, seq) for d in t.shape)
        if t.dtype in ("float32", "float16"):
            out[name] = rng.standard_normal(shape).astype(t.dtype)
            continue
        table = next((n.attrs["table"] for n in cons.get(name, []) if n.op == "embed_ln"), None)
        if table is not None:
            out[name] = rng.integers(0, g.consts[table].shape[0], shape).astype(t.dtype)
        elif "mask" in name.lower() and len(shape) == 2:
            out[name] = (np.arange(shape[1])[None, :] < lengths[:, None]).astype(t.dtype)
        else:
            out[name] = np.zeros(shape, t.dtype)
    return out


def read_calibration(data: bytes, g: Graph, opts: CompileOptions) -> Calibration:
    """Parse uploaded calibration data (``numpy.savez`` bytes, no pickles) against the graph's
    inputs: every input present, same rows in each, per-row shape as declared (a sequence axis at
    most ``max_seq``), values castable to the input's dtype. CompileError (stage accuracy) names
    the first violation."""
    import io
    import zipfile

    def bad(msg: str) -> CompileError:
        return CompileError(f"calibration data: {msg}", stage="accuracy")

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise bad(f"not a numpy .npz archive without pickles ({exc})") from None
    missing = [x for x in g.inputs if x not in arrays]
    if missing:
        raise bad(f"no array for graph input(s) {missing}; arrays: {sorted(arrays)}")
    rows = {x: arrays[x].shape[0] if arrays[x].ndim else 0 for x in g.inputs}
    if len(set(rows.values())) != 1 or min(rows.values()) < 1:
        raise bad(f"every input needs the same number of rows >= 1 along axis 0, got {rows}")
    out: Calibration = {}
    for x in g.inputs:
        a, t = arrays[x][:MAX_UPLOADED_ROWS], g.types[x]
        if a.ndim != len(t.shape):
            raise bad(f"input {x!r}: {a.ndim} dims, the model declares {len(t.shape)} ({t.shape})")
        for axis, d in enumerate(t.shape[1:], 1):
            if d.static and a.shape[axis] != d.coef:
                raise bad(f"input {x!r}: axis {axis} is {a.shape[axis]}, the model declares {d.coef}")
            if d.t and a.shape[axis] > opts.max_seq:
                raise bad(f"input {x!r}: {a.shape[axis]} tokens exceed max_seq {opts.max_seq}")
        kind = np.dtype(t.dtype).kind
        if a.dtype.kind not in ({"f", "i", "u"} if kind == "f" else {"i", "u", "b"}):
            raise bad(f"input {x!r}: {a.dtype} cannot feed a {t.dtype} input")
        out[x] = np.ascontiguousarray(a, dtype=t.dtype)
    return out


def eval_inputs(
    g: Graph, opts: CompileOptions, uploaded: Calibration | None = None
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Batches of inputs for the report, and a line saying where they came from."""
    if uploaded:
        n = int(next(iter(uploaded.values())).shape[0])
        feeds = [
            {x: a[i : i + GENERATED_ROWS] for x, a in uploaded.items()} for i in range(0, n, GENERATED_ROWS)
        ]
        return feeds, f"the calibration data uploaded with the model ({n} rows)"
    seq_model = any(d.t for x in g.inputs for d in g.types[x].shape)
    max_seq = opts.max_seq if seq_model else 1
    tables = [g.consts[n.attrs["table"]].shape[0] for n in g.nodes if n.op == "embed_ln"]
    calib_ok = set(g.inputs) <= {"input_ids", "attention_mask", "token_type_ids"} and "input_ids" in g.inputs
    if calib_ok and tables and all(v == CALIBRATIONS[opts.calibration][1] for v in tables):
        samples = calibration_ids(opts.calibration)
        step = max(1, len(samples) // CALIBRATION_SAMPLES)
        picked = [s[:max_seq] for s in samples[::step][:CALIBRATION_SAMPLES]]
        batches = calibration_batches(picked)
        feeds = [calibration_feeds(g, b) for b in batches]
        return feeds, f"calibration set {opts.calibration!r} ({len(picked)} samples)"
    seq = min(GENERATED_SEQ, max_seq)
    rng = np.random.default_rng(SEED)
    shape = f"{GENERATED_ROWS} rows" + (f" x {seq} tokens" if seq_model else "")
    return [
        _feeds_of(g, GENERATED_ROWS, seq, rng)
    ], f"generated inputs of the declared shapes ({shape}, seed {SEED})"


def _rows_error(q: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: relative max-norm error and cosine. q, r (B, ...) float32."""
    q64, r64 = q.reshape(q.shape[0], -1).astype(np.float64), r.reshape(r.shape[0], -1).astype(np.float64)
    peak = np.abs(r64).max(axis=1)
    # a row whose reference is (near) all zeros, a ReLU output say, is measured against 0.1% of
    # the tensor's peak instead: equal rows give 0 and a small deviation is not infinite
    den = np.maximum(peak, max(1e-3 * float(peak.max(initial=0.0)), 1e-30))
    rel = np.abs(q64 - r64).max(axis=1) / den
    norms = np.linalg.norm(q64, axis=1) * np.linalg.norm(r64, axis=1)
    cos = np.where(norms > 0, (q64 * r64).sum(axis=1) / np.maximum(norms, 1e-300), 1.0)
    return rel, cos


class _Bench:
    """The inputs, the reference values, and the candidate weights of one graph."""

    def __init__(
        self, g: Graph, opts: CompileOptions, weights: dict[str, OpWeights], uploaded: Calibration | None
    ) -> None:
        self.g = g
        self.feeds, self.source = eval_inputs(g, opts, uploaded)
        self.masks = [next((f[x] for x in g.inputs if "mask" in x.lower()), None) for f in self.feeds]
        self.ref = [run_graph(g, f, {}) for f in self.feeds]  # every value, kept for resuming
        self.deq: dict[str, np.ndarray] = {}
        done: dict[int, np.ndarray] = {}  # id of packed nibbles -> dequantized: a shared weight once
        for n in g.nodes:
            w = weights.get(n.name, {})
            if n.op == "linear" and "packed" in w:
                if id(w["packed"]) not in done:
                    k2, cols = w["packed"].shape
                    q = Int4Weight(
                        w["packed"], w["scales"], w["zeros"], int(n.attrs["group"]), 2 * k2, cols, "fp16"
                    )
                    done[id(w["packed"])] = dequantize(q)  # (K, N) f32
                self.deq[n.name] = done[id(w["packed"])]
        self.tables = {
            n.attrs["table"]: weights[n.name]["table"].astype(np.float32)
            for n in g.nodes
            if n.op == "embed_ln" and weights[n.name]["table"].dtype != np.float32
        }
        self.index = {n.name: i for i, n in enumerate(g.nodes)}
        # the first node whose result differs from the reference: fp16 tables are read by embed_ln
        self.first_lossy = min(
            (i for i, n in enumerate(g.nodes) if n.op == "embed_ln" and n.attrs["table"] in self.tables),
            default=len(g.nodes),
        )

    @property
    def rows(self) -> int:
        return sum(int(f[self.g.inputs[0]].shape[0]) for f in self.feeds)

    def measure(self, int4: list[str]) -> list[OutputError]:
        """Errors of the plan whose INT4 linears are ``int4`` (the rest fp32). Nodes before the
        first lossy one compute the reference's values, so the run resumes from those."""
        lw = {k: self.deq[k] for k in int4}
        start = min([self.first_lossy, *(self.index[k] for k in int4)])
        per: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for f, ref, mask in zip(self.feeds, self.ref, self.masks, strict=True):
            got = run_graph(self.g, f, lw, self.tables, start, ref)
            for out in self.g.outputs:
                q, r = got[out], ref[out]
                if mask is not None and r.ndim >= 3 and r.shape[:2] == mask.shape:
                    keep = mask.astype(bool)[(..., *([None] * (r.ndim - 2)))]  # (B, T, 1...)
                    q, r = q * keep, r * keep
                rel, cos = _rows_error(q, r)
                name = self.g.public.get(out, out)
                per.setdefault(name, ([], []))[0].append(rel)
                per[name][1].append(cos)
        out_errs = []
        for name, (rels, coss) in per.items():
            rel, cos = np.concatenate(rels), np.concatenate(coss)
            out_errs.append(
                OutputError(name, float(rel.max()), float(rel.mean()), float(cos.min()), float(cos.mean()))
            )
        return out_errs


def _worst(errs: list[OutputError]) -> float:
    return max((e.max_rel for e in errs), default=0.0)


def check_accuracy(
    g: Graph, opts: CompileOptions, weights: dict[str, OpWeights], uploaded: Calibration | None = None
) -> AccuracyReport | None:
    """Measure the quantized plan's error; keep linears fp32 (``weights`` updated in place) until
    it fits ``opts.max_rel_error``. None when nothing is quantized (the plan is the reference).

    Over budget: sensitivities (one run per INT4 linear, each resumed at that linear), then a
    binary search for the fewest most-sensitive linears to keep (error falls as more are kept;
    the plan shipped is the one measured), ~log2(L) + 1 more runs."""
    bench = _Bench(g, opts, weights, uploaded)
    int4 = list(bench.deq)
    if not int4 and not bench.tables:
        return None
    errs = bench.measure(int4)
    report = AccuracyReport(bench.source, bench.rows, opts.max_rel_error, errs, _worst(errs), int4)
    budget = opts.max_rel_error
    if budget is None or report.max_rel <= budget:
        return report
    report.sensitivity = {k: _worst(bench.measure([k])) for k in int4}
    order = sorted(int4, key=lambda x: -report.sensitivity[x])
    tried: dict[int, list[OutputError]] = {}

    def keep(k: int) -> list[OutputError]:  # errors with the k most sensitive linears fp32
        if k not in tried:
            tried[k] = bench.measure([x for x in int4 if x not in order[:k]])
        return tried[k]

    if _worst(keep(len(order))) > budget:
        report.kept_fp32, report.int4_linears, report.outputs = order, [], keep(len(order))
        raise CompileError(
            f"error budget not met: max relative error {report.max_rel:.3g} > --max-rel-error {budget:g} "
            f"with all {len(int4)} INT4 linears kept fp32 (all-INT4: {report.all_int4_max_rel:.3g}); "
            f"what is left is fp16 embedding rounding; raise the budget or compile unquantized",
            stage="accuracy",
            detail=format_report(report),
        )
    lo, hi = 1, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if _worst(keep(mid)) <= budget:
            hi = mid
        else:
            lo = mid + 1
    report.kept_fp32 = order[:hi]
    report.int4_linears = [x for x in int4 if x not in report.kept_fp32]
    report.outputs = keep(hi)
    nodes = {n.name: n for n in g.nodes}
    for k in report.kept_fp32:
        weights[k] = fp32_linear(g, nodes[k], opts)
    return report


def format_report(report: AccuracyReport) -> str:
    """Plain-text lines of a report (the compiler's failure detail)."""
    lines = [f"inputs: {report.inputs}, {report.rows} rows"]
    for o in report.outputs:
        lines.append(
            f"  {o.name}: max rel {o.max_rel:.4g}, mean rel {o.mean_rel:.4g}, "
            f"cosine min {o.cos_min:.6f} mean {o.cos_mean:.6f}"
        )
    if report.sensitivity:
        lines.append("sensitivity (max rel error with only this linear INT4):")
        lines += [f"  {k}: {v:.4g}" for k, v in sorted(report.sensitivity.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)
