"""The accuracy report and the error budget (passes/accuracy.py): the report measures what the
executor's plan runtime computes; an over-budget plan keeps its most sensitive linears fp32 until
it fits; a budget that cannot be met fails the compile with the numbers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import embed_mlp_bytes, mlp_bytes, user_mlp_bytes

from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.onnx import load_onnx
from anvil_compiler.lower import Lowered
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.accuracy import GENERATED_ROWS, SEED, eval_inputs
from anvil_compiler.passes.fuse import fuse
from anvil_compiler.pipeline import compile_graph


def _compile(data: bytes, **opts: object) -> Lowered:
    return compile_graph(load_onnx(data, "m"), CompileOptions(max_seq=32, **opts))  # type: ignore[arg-type]


def _plan_outputs(low: Lowered, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from anvil_core.proto_gen import plan_generated as pg
    from anvil_executor.plan_runtime.model import PlanModel
    from anvil_executor.plan_runtime.plan import LoadedPlan

    model = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights)
    return next(iter(model.forward(feeds).values()))


def test_report_of_a_plan_within_budget() -> None:
    low = _compile(mlp_bytes(), max_rel_error=0.5)
    acc = low.accuracy
    assert acc is not None
    assert acc["inputs"] == f"generated inputs of the declared shapes ({GENERATED_ROWS} rows, seed {SEED})"
    assert acc["rows"] == GENERATED_ROWS and acc["budget"] == 0.5
    assert 0.05 < acc["max_rel"] <= 0.5 and 0 < acc["mean_rel"] <= acc["max_rel"]
    assert acc["kept_fp32"] == [] and acc["sensitivity"] == {}
    assert acc["int4_linears"] == ["fc1", "fc2"] and low.stats["int4_linears"] == 2
    (out,) = acc["outputs"]
    assert out["name"] == "y" and 0.9 < out["cos_min"] <= out["cos_mean"] <= 1.0
    assert (
        _compile(mlp_bytes(), max_rel_error=0.5).accuracy == acc
    )  # deterministic: same inputs, same numbers


def test_report_matches_the_plan_runtime() -> None:
    """The numbers are those of the plans the executor runs, on the report's own inputs."""
    low_q = _compile(user_mlp_bytes(), max_rel_error=None, max_batch=GENERATED_ROWS)
    low_f = _compile(user_mlp_bytes(), quantize=False, max_batch=GENERATED_ROWS)
    assert low_f.accuracy is None  # nothing quantized: nothing to report
    g = load_onnx(user_mlp_bytes(), "m")
    fuse(g)
    (feeds,), _ = eval_inputs(g, CompileOptions(max_seq=32))
    q, r = _plan_outputs(low_q, feeds), _plan_outputs(low_f, feeds)
    rel = np.abs(q - r).max(axis=1) / np.abs(r).max(axis=1)
    acc = low_q.accuracy
    assert acc is not None
    assert acc["max_rel"] == pytest.approx(rel.max(), rel=1e-3)
    assert acc["mean_rel"] == pytest.approx(rel.mean(), rel=1e-3)


def test_issue_22_model_keeps_layers_fp32_until_it_fits_the_default_budget() -> None:
    report_only = _compile(user_mlp_bytes(), max_rel_error=None).accuracy
    assert report_only is not None and report_only["max_rel"] > 0.1  # what nobody was told
    low = _compile(user_mlp_bytes())
    acc = low.accuracy
    assert acc is not None
    assert acc["all_int4_max_rel"] == pytest.approx(report_only["max_rel"])
    assert acc["max_rel"] <= 0.05
    sens = acc["sensitivity"]
    assert set(sens) == {"fc1", "fc2"} and all(v > 0.05 for v in sens.values())
    assert acc["kept_fp32"] == sorted(sens, key=lambda k: -sens[k])  # most sensitive first
    assert low.stats["fp32_linears"] == len(acc["kept_fp32"])


def test_budget_keeps_only_the_most_sensitive_linear_when_that_suffices() -> None:
    full = _compile(user_mlp_bytes(), max_rel_error=None).accuracy
    low = _compile(user_mlp_bytes(), max_rel_error=0.05)
    sens = low.accuracy["sensitivity"] if low.accuracy else {}
    most, least = sorted(sens, key=lambda k: -sens[k])
    assert full is not None
    # between the error with one linear INT4 (the least sensitive) and with both
    budget = (sens[least] + full["max_rel"]) / 2
    acc = _compile(user_mlp_bytes(), max_rel_error=budget).accuracy
    assert acc is not None
    assert acc["kept_fp32"] == [most] and acc["int4_linears"] == [least]
    assert acc["max_rel"] == pytest.approx(sens[least]) and acc["max_rel"] <= budget


def test_impossible_budget_fails_with_the_numbers() -> None:
    """With every linear fp32 the fp16 embedding table still moves the outputs by ~2e-4."""
    with pytest.raises(CompileError) as err:
        _compile(embed_mlp_bytes(), max_rel_error=1e-6)
    e = err.value
    assert e.stage == "accuracy"
    assert "error budget not met" in str(e) and "1e-06" in str(e) and "all 2 INT4 linears kept fp32" in str(e)
    floor = float(str(e).split("max relative error ")[1].split()[0])
    assert 1e-6 < floor < 1e-2
    assert "fc1:" in e.detail and "fc2:" in e.detail and "y: max rel" in e.detail
    ok = _compile(embed_mlp_bytes(), max_rel_error=1e-2).accuracy  # above the floor: fits
    assert ok is not None and ok["max_rel"] <= 1e-2 and ok["inputs"].endswith("x 32 tokens, seed 0)")


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_budget_must_be_positive(bad: float) -> None:
    with pytest.raises(CompileError, match="max_rel_error must be a number > 0"):
        CompileOptions(max_rel_error=bad)


def test_token_models_of_the_calibration_vocabulary_use_the_calibration_set() -> None:
    from test_gptq import _one_layer_minilm

    from anvil_compiler.frontends.hf import load_hf_bundle

    g = load_hf_bundle(_one_layer_minilm(), "m1")
    fuse(g)
    feeds, source = eval_inputs(g, CompileOptions(max_seq=16))
    assert source == "calibration set 'bert-uncased' (24 samples)"
    assert sum(f["input_ids"].shape[0] for f in feeds) == 24
    assert all(
        f["input_ids"].shape[1] <= 16 and f["input_ids"][:, 0].tolist() == [101] * len(f["input_ids"])
        for f in feeds
    )


def test_row_error_measures() -> None:
    from anvil_compiler.passes.accuracy import _rows_error

    r = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 0.0, 0.0]], np.float32)
    q = r + np.array([[0.1, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.3, 0.0]], np.float32)
    rel, cos = _rows_error(q, r)
    np.testing.assert_allclose(rel, [0.1 / 2.0, 0.0, 0.3 / 3.0], rtol=1e-6)
    assert cos[1] == 1.0 and cos[0] == pytest.approx(
        float(q[0] @ r[0] / np.linalg.norm(q[0]) / np.linalg.norm(r[0]))
    )
    rel_zero_row, _ = _rows_error(
        np.array([[1e-3, 0.0], [1.0, 1.0]], np.float32), np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
    )
    assert np.isfinite(rel_zero_row).all() and rel_zero_row[0] == pytest.approx(1.0)


def _npz(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def test_uploaded_calibration_data_feeds_the_report() -> None:
    """Inputs in [0, 1] (an image-like range), not N(0, 1): the report runs on them."""
    x = np.random.default_rng(9).random((100, 64)).astype(np.float32)
    data = _npz(x=x)
    low_q = compile_graph(
        load_onnx(user_mlp_bytes(), "m"), CompileOptions(max_rel_error=None, max_batch=128), calibration=data
    )
    acc = low_q.accuracy
    assert acc is not None
    assert acc["inputs"] == "the calibration data uploaded with the model (100 rows)" and acc["rows"] == 100
    low_f = compile_graph(load_onnx(user_mlp_bytes(), "m"), CompileOptions(quantize=False, max_batch=128))
    q, r = _plan_outputs(low_q, {"x": x}), _plan_outputs(low_f, {"x": x})
    rel = np.abs(q - r).max(axis=1) / np.abs(r).max(axis=1)
    assert acc["max_rel"] == pytest.approx(rel.max(), rel=1e-3)
    generated = _compile(user_mlp_bytes(), max_rel_error=None).accuracy
    assert generated is not None and generated["max_rel"] != pytest.approx(acc["max_rel"], rel=1e-2)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"other": np.zeros((4, 64), np.float32)}, r"no array for graph input\(s\) \['x'\]"),
        ({"x": np.zeros((4, 63), np.float32)}, "axis 1 is 63, the model declares 64"),
        ({"x": np.zeros((4, 2, 64), np.float32)}, "3 dims, the model declares 2"),
        ({"x": np.array([["a"] * 64] * 4)}, "cannot feed a float32 input"),
    ],
)
def test_bad_calibration_data_is_refused_with_the_constraint(
    arrays: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(CompileError, match=message) as err:
        compile_graph(load_onnx(user_mlp_bytes(), "m"), CompileOptions(), calibration=_npz(**arrays))
    assert err.value.stage == "accuracy"
    with pytest.raises(CompileError, match=r"not a numpy \.npz archive"):
        compile_graph(load_onnx(user_mlp_bytes(), "m"), CompileOptions(), calibration=b"not a zip")


def test_calibration_data_is_part_of_the_artifact_key() -> None:
    from anvil_compiler.artifacts import artifact_key, model_digest

    opts = CompileOptions()
    plain = artifact_key("d", "onnx", opts)
    assert plain == artifact_key("d", "onnx", opts, "")
    assert artifact_key("d", "onnx", opts, model_digest(b"a")) not in (
        plain,
        artifact_key("d", "onnx", opts, model_digest(b"b")),
    )
