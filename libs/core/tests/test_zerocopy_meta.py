"""Slot metadata (proto/zerocopy.fbs): round trips, layout, refusals, fuzzing, the patched envelope,
and the generated code's freshness."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anvil_core.zerocopy import meta as zm
from anvil_core.zerocopy.meta import InferMeta, MetaError, ResultMeta, TensorDesc

ROOT = Path(__file__).resolve().parents[3]


def _meta(**kw: object) -> tuple[bytes, tuple[TensorDesc, ...], int]:
    tensors = kw.pop("tensors", [("INPUT0", "FP32", (2, 8), 64), ("IDS", "INT64", (2,), 16)])
    return zm.plan(lambda d: zm.encode_infer(InferMeta("mlp", d, **kw)), tensors)  # type: ignore[arg-type]


def test_infer_meta_round_trips_and_tensors_are_aligned_after_the_block() -> None:
    block, descs, payload_length = _meta(outputs=("OUTPUT0",), priority=1, timeout_us=500, trace_id="t")
    meta = zm.decode_infer(block)
    assert meta.inputs == descs and meta.outputs == ("OUTPUT0",)
    assert (meta.model, meta.priority, meta.timeout_us, meta.trace_id) == ("mlp", 1, 500, "t")
    assert descs[0].offset == zm.align(16 + len(block)) and all(t.offset % 64 == 0 for t in descs)
    assert descs[1].offset >= descs[0].offset + descs[0].length
    assert 16 + payload_length == meta.end == descs[1].offset + 16


def test_read_block_copies_only_the_block_and_checks_its_prefix() -> None:
    block, _, payload_length = _meta()
    payload = bytearray(block) + bytearray(payload_length - len(block))
    assert zm.read_block(memoryview(payload), payload_length) == block
    with pytest.raises(MetaError, match="overruns"):
        zm.read_block(memoryview(payload), len(block) - 1)
    with pytest.raises(MetaError, match="no room"):
        zm.read_block(b"\x01\x00", 2)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"tensors": [("A", "FP32", (4,), 15)]}, "needs 16"),
        ({"tensors": [("A", "FP32", (4,), 16), ("A", "FP32", (4,), 16)]}, "unique"),
        ({"tensors": []}, "at least one input"),
        ({"tensors": [("A", "BYTES", (4,), 15)]}, "needs 16"),
        ({"priority": 7}, "InferMeta.priority is 7; it must be in ..3"),
    ],
)
def test_inconsistent_metadata_is_refused(kw: dict[str, object], says: str) -> None:
    block, _, _ = _meta(**kw)
    with pytest.raises(MetaError) as info:
        zm.decode_infer(block)
    assert says in info.value.message


def test_offsets_inside_the_block_or_unaligned_are_refused() -> None:
    for offset in (0, 65, 16):
        d = (TensorDesc("A", "FP32", (4,), offset, 16),)
        with pytest.raises(MetaError, match="multiple of 64"):
            zm.decode_infer(zm.encode_infer(InferMeta("m", d)))


def test_result_layout_writes_each_reply_at_the_planned_size() -> None:
    layout = zm.result_layout("identity", "1", [("OUTPUT0", "FP32", (1, 4), 16), ("S", "BYTES", (1,), 9)])
    sizes = set()
    for q, c in [(1, 2), (123456, 7), (0xFFFF_FFFF, 0)]:
        block = layout.block_with(q, c)
        sizes.add(len(block))
        assert zm.decode_result(block) == ResultMeta("identity", layout.outputs, "1", q, c)
    assert len(sizes) == 1 and layout.outputs[0].offset >= 16 + sizes.pop()  # outputs after the block


@settings(max_examples=2_000, deadline=None)
@given(st.binary(min_size=4, max_size=300), st.integers(0, 1 << 16))
def test_random_blocks_decode_or_raise_meta_error_only(body: bytes, declared: int) -> None:
    block = struct.pack("<I", len(body)) + body
    try:
        meta = zm.decode_infer(zm.read_block(block, len(block)))
    except MetaError:
        return
    assert meta.model and meta.inputs and all(t.offset % 64 == 0 for t in meta.inputs)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 199), st.integers(0, 255))
def test_single_byte_corruptions_never_escape_as_other_errors(pos: int, value: int) -> None:
    block, _, _ = _meta(outputs=("OUTPUT0",))
    bad = bytearray(block)
    bad[4 + pos % (len(block) - 4)] = value
    try:
        zm.decode_infer(bytes(bad))
    except MetaError:
        pass


def test_generated_python_is_fresh(tmp_path: Path) -> None:
    flatc = shutil.which("flatc")
    if flatc is None:
        pytest.skip("flatc not installed (it is in the dev group: uv sync)")
    args = ["--python", "--gen-onefile", "--gen-object-api", "-o", str(tmp_path)]
    subprocess.run([flatc, *args, str(ROOT / "proto/zerocopy.fbs")], check=True)
    fresh = (tmp_path / "zerocopy_generated.py").read_text()
    committed = ROOT / "libs/core/src/anvil_core/proto_gen/zerocopy_generated.py"
    assert fresh == committed.read_text(), "stale: regenerate proto/zerocopy.fbs (Makefile `proto`)"
