"""The wire schemas as the codec uses them: one descriptor per table and field, built at import from
the field tables `make proto` derives from `proto/*.fbs` (`proto_gen/*_schema.py`), joined to flatc's
object-API classes (`InferRequestT`, ...) that decoded messages are instances of.

Nothing here is typed by hand: adding a field to a table in the schema and running `make proto`
makes the codec read, verify and write it (as the object-API attribute flatc names it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from anvil_core.proto_gen import anvil_generated, anvil_schema, zerocopy_generated, zerocopy_schema

__all__ = ["Enum", "Field", "Kind", "TableDesc", "enum", "table"]

_SCALAR_FMT = {
    "bool": "?", "byte": "b", "ubyte": "B", "short": "h", "ushort": "H", "int": "i", "uint": "I",
    "long": "q", "ulong": "Q", "float": "f", "double": "d", "int8": "b", "uint8": "B", "int16": "h",
    "uint16": "H", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float32": "f",
    "float64": "d",
}  # fmt: skip
_MODULES: dict[str, ModuleType] = {"anvil.proto": anvil_generated, "anvil.zerocopy": zerocopy_generated}


class Kind:
    """How a field is stored (small ints: the reader dispatches on them per field)."""

    SCALAR = 0  # inline number (enums too)
    STRING = 1
    TABLE = 2
    UNION = 3  # the value of a union; its type is the field before it
    VEC_SCALAR = 4
    VEC_STRING = 5
    VEC_TABLE = 6


@dataclass(frozen=True)
class Enum:
    name: str
    values: dict[str, int]  # member -> value
    names: dict[int, str]  # value -> member


@dataclass(eq=False)
class Field:
    name: str  # as in the schema: request_id
    attr: str  # the object-API attribute flatc generates: requestId
    slot: int  # vtable slot
    kind: int  # Kind.*
    fmt: str  # struct format of the inline value ("I" for references) or of a vector element
    size: int  # bytes of the inline value
    default: Any  # absent field (strings, tables, vectors: None)
    where: str  # "InferRequest.priority", for messages
    lo: int | None = None  # inclusive bounds of an integer (schema attributes min/max)
    hi: int | None = None
    allowed: frozenset[int] | None = None  # enum values (minus those under `lo`)
    enum: Enum | None = None
    nonempty: bool = False  # strings
    max_len: int | None = None  # strings, bytes of UTF-8
    absent: str | None = None  # why the field may not be absent (its default breaks a constraint)
    table: TableDesc | None = None  # TABLE / VEC_TABLE
    union: dict[int, TableDesc] | None = None  # UNION: type value -> table
    st: struct.Struct = field(default_factory=lambda: struct.Struct("<I"))


@dataclass(eq=False)
class TableDesc:
    name: str  # qualified: anvil.proto.InferRequest
    short: str  # InferRequest
    cls: type  # flatc's object-API class (InferRequestT)
    fields: list[Field] = field(default_factory=list)
    n_slots: int = 0


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _build(schema: dict[str, Any]) -> tuple[dict[str, Enum], dict[str, TableDesc]]:
    enums = {
        name: Enum(name, dict(e["values"]), {v: k for k, v in e["values"].items()})
        for name, e in schema["enums"].items()
    }
    tables: dict[str, TableDesc] = {}
    for name in schema["tables"]:
        ns, short = name.rsplit(".", 1)
        tables[name] = TableDesc(name, short, getattr(_MODULES[ns], short + "T"))
    for name, raw_fields in schema["tables"].items():
        desc = tables[name]
        probe = desc.cls()
        for raw in raw_fields:
            f = _field(raw, desc, enums, tables, schema["unions"])
            if not hasattr(probe, f.attr):
                raise RuntimeError(f"{desc.cls.__name__} has no attribute {f.attr}: run `make proto`")
            desc.fields.append(f)
        desc.n_slots = max((f.slot for f in desc.fields), default=-1) + 1
    return enums, tables


def _field(
    raw: dict[str, Any],
    desc: TableDesc,
    enums: dict[str, Enum],
    tables: dict[str, TableDesc],
    unions: dict[str, dict[str, int]],
) -> Field:
    typ, attrs = raw["type"], raw["attrs"]
    common = {
        "name": raw["name"],
        "attr": _camel(raw["name"]),
        "slot": raw["slot"],
        "where": f"{desc.short}.{raw['name']}",
        "nonempty": bool(attrs.get("nonempty")),
        "max_len": attrs.get("max_len"),
        "lo": attrs.get("min"),
        "hi": attrs.get("max"),
    }
    if typ in ("scalar", "enum", "union_type"):
        fmt = _SCALAR_FMT[raw["elem"]]
        f = Field(kind=Kind.SCALAR, fmt=fmt, size=struct.calcsize(fmt), default=raw["default"], **common)
        if typ == "enum":
            f.enum = enums[raw["ref"]]
        elif typ == "union_type":
            members = unions[raw["ref"]]
            f.enum = Enum(raw["ref"], dict(members), {v: k for k, v in members.items()})
        if f.enum is not None:
            f.allowed = frozenset(v for v in f.enum.values.values() if f.lo is None or v >= f.lo)
        d = f.default
        if (f.allowed is not None and d not in f.allowed) or (
            f.allowed is None and not _within(d, f.lo, f.hi)
        ):
            f.absent = f"is absent, and its default {d} is not allowed (min {f.lo}, max {f.hi})"
        f.st = struct.Struct("<" + fmt)
        return f
    if typ == "string":
        absent = "is absent; it must be a non-empty string" if common["nonempty"] else None
        return Field(kind=Kind.STRING, fmt="I", size=4, default=None, absent=absent, **common)
    if typ == "table":
        return Field(kind=Kind.TABLE, fmt="I", size=4, default=None, table=tables[raw["ref"]], **common)
    if typ == "union":
        ns = raw["ref"].rsplit(".", 1)[0]
        union = {v: tables[f"{ns}.{m}"] for m, v in unions[raw["ref"]].items() if v}
        return Field(kind=Kind.UNION, fmt="I", size=4, default=None, union=union, **common)
    elem = raw["elem"]
    if elem == "string":
        return Field(kind=Kind.VEC_STRING, fmt="I", size=4, default=None, **common)
    if elem == "table":
        return Field(kind=Kind.VEC_TABLE, fmt="I", size=4, default=None, table=tables[raw["ref"]], **common)
    fmt = _SCALAR_FMT[elem]
    f = Field(kind=Kind.VEC_SCALAR, fmt=fmt, size=4, default=None, **common)
    f.st = struct.Struct("<" + fmt)
    return f


def _within(value: Any, lo: int | None, hi: int | None) -> bool:
    return (lo is None or value >= lo) and (hi is None or value <= hi)


_ENUMS: dict[str, Enum] = {}
_TABLES: dict[str, TableDesc] = {}
for _schema in (anvil_schema.SCHEMA, zerocopy_schema.SCHEMA):
    _e, _t = _build(_schema)
    for _k, _v in _e.items():
        _ENUMS.setdefault(_k, _v)
    for _k, _d in _t.items():
        _TABLES.setdefault(_k, _d)  # anvil.proto tables also appear in zerocopy's (include)


def table(name: str) -> TableDesc:
    """A table by its short name in anvil.proto / anvil.zerocopy ("InferRequest", "InferMeta")."""
    for ns in _MODULES:
        desc = _TABLES.get(f"{ns}.{name}")
        if desc is not None:
            return desc
    raise KeyError(f"no table {name!r} in the wire schemas")


def enum(name: str) -> Enum:
    """An enum of anvil.proto by its short name ("DType", "ErrorCode")."""
    return _ENUMS[f"anvil.proto.{name}"]
