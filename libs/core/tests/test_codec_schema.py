"""The codec's field tables (parsed from proto/*.fbs by `make proto`) agree with flatc's own
generated builders: every table's slot count, and every field's slot, type and default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from anvil_core.codec import fbs_schema
from anvil_core.codec.schema import _TABLES, Kind, TableDesc
from anvil_core.proto_gen import anvil_generated, zerocopy_generated

_PREPEND = {
    "?": "Bool",
    "b": "Int8",
    "B": "Uint8",
    "h": "Int16",
    "H": "Uint16",
    "i": "Int32",
    "I": "Uint32",
    "q": "Int64",
    "Q": "Uint64",
    "f": "Float32",
    "d": "Float64",
}


class _Recorder:
    """Stands in for flatbuffers.Builder: remembers the one call a generated function makes."""

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> int:
            self.call = (name, *args)
            return 0

        return record


def _upper_camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _module(desc: TableDesc) -> Any:
    return anvil_generated if desc.name.startswith("anvil.proto.") else zerocopy_generated


@pytest.mark.parametrize("desc", list(_TABLES.values()), ids=lambda d: d.short)
def test_field_tables_match_flatc_generated_builders(desc: TableDesc) -> None:
    mod, rec = _module(desc), _Recorder()
    getattr(mod, f"{desc.short}Start")(rec)
    assert rec.call == ("StartObject", desc.n_slots)
    for f in desc.fields:
        getattr(mod, f"{desc.short}Add{_upper_camel(f.name)}")(rec, 0)
        if f.kind == Kind.SCALAR:
            assert rec.call == (f"Prepend{_PREPEND[f.fmt]}Slot", f.slot, 0, f.default), f.where
        else:
            assert rec.call[0] == "PrependUOffsetTRelativeSlot" and rec.call[1] == f.slot, f.where
        if f.kind in (Kind.VEC_SCALAR, Kind.VEC_STRING, Kind.VEC_TABLE):
            getattr(mod, f"{desc.short}Start{_upper_camel(f.name)}Vector")(rec, 3)
            width = f.st.size if f.kind == Kind.VEC_SCALAR else 4
            assert rec.call[:3] == ("StartVector", width, 3), f.where


def test_the_parser_refuses_what_it_does_not_understand(tmp_path: Path) -> None:
    bad = tmp_path / "bad.fbs"
    bad.write_text("namespace x;\ntable T { a: int (id: 3); }\n")
    with pytest.raises(fbs_schema.SchemaError, match="not supported"):
        fbs_schema.parse(bad)
    bad.write_text("namespace x;\nstruct S { a: int; }\n")
    with pytest.raises(fbs_schema.SchemaError, match="structs"):
        fbs_schema.parse(bad)


def test_a_new_field_is_a_schema_edit(tmp_path: Path) -> None:
    """What issue #19 will do: a field appended to a table gets the next slot, nothing else moves."""
    src = Path(__file__).resolve().parents[3] / "proto" / "anvil.fbs"
    last = "  executor_done_unix_ns: long (min: 0);"  # InferResponse's last field
    text = src.read_text().replace(last, f"{last}\n  hop_ns: [long];", 1)
    (tmp_path / "anvil.fbs").write_text(text)
    before = fbs_schema.parse(src)["tables"]["anvil.proto.InferResponse"]
    after = fbs_schema.parse(tmp_path / "anvil.fbs")["tables"]["anvil.proto.InferResponse"]
    assert after[:-1] == before
    assert after[-1] | {"attrs": {}} == {
        "name": "hop_ns",
        "slot": len(before),
        "type": "vector",
        "elem": "long",
        "ref": None,
        "default": None,
        "attrs": {},
    }
