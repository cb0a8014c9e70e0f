"""`make proto`'s reflection step: parse a `proto/*.fbs` schema into field tables, written next to
flatc's generated Python as `proto_gen/<name>_schema.py` (a plain literal; nothing here runs at import).

The Python flatbuffers runtime ships no reflection schema, so the codec cannot read flatc's `.bfbs`;
this parser reads the subset of the schema language Anvil's wire schemas use and refuses anything
else (so a schema edit it does not understand fails `make proto` instead of being misread):
`namespace`, `include`, `attribute`, `enum X : <int type>`, `union`, `table` (fields with a scalar,
string, enum, table, union or vector type, an optional default and attributes), `root_type`.
Slots are assigned as flatc assigns them (declaration order; a union field takes two: `<name>_type`
then `<name>`); `test_codec_schema.py` checks every slot, type and default against flatc's own
generated builders.

Field attributes the codec's verifier enforces (declared in the schema, ignored by flatc's Python):
`min: N` / `max: N` on integers, `nonempty` and `max_len: N` (bytes) on strings.

    python -m anvil_core.codec.fbs_schema proto/anvil.fbs libs/core/src/anvil_core/proto_gen
"""

from __future__ import annotations

import pprint
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["SchemaError", "parse", "render"]

SCALARS = {
    "bool": "?", "byte": "b", "ubyte": "B", "short": "h", "ushort": "H", "int": "i", "uint": "I",
    "long": "q", "ulong": "Q", "float": "f", "double": "d", "int8": "b", "uint8": "B", "int16": "h",
    "uint16": "H", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float32": "f",
    "float64": "d",
}  # fmt: skip
_ENFORCED = {"min", "max", "nonempty", "max_len"}
_TOKEN = re.compile(r'\s*(?:(//[^\n]*)|("(?:[^"\\]|\\.)*")|([A-Za-z_][\w.]*)|(-?\d+(?:\.\d+)?)|(\S))')


class SchemaError(Exception):
    """A schema construct this parser does not support, or a reference it cannot resolve."""


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        pos = m.end()
        if m.group(1) is None and m.group(0).strip():
            out.append(m.group(0).strip())
    return out


class _Parser:
    def __init__(self, tokens: list[str], path: Path) -> None:
        self.t, self.i, self.path = tokens, 0, path

    def next(self) -> str:
        if self.i >= len(self.t):
            raise SchemaError(f"{self.path}: unexpected end of schema")
        self.i += 1
        return self.t[self.i - 1]

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise SchemaError(f"{self.path}: expected {tok!r}, got {got!r}")

    def peek(self) -> str:
        return self.t[self.i] if self.i < len(self.t) else ""

    def attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.peek() != "(":
            return out
        self.next()
        while True:
            name = self.next()
            value: Any = True
            if self.peek() == ":":
                self.next()
                raw = self.next()
                value = raw.strip('"') if raw.startswith('"') else int(raw)
            out[name] = value
            sep = self.next()
            if sep == ")":
                return out
            if sep != ",":
                raise SchemaError(f"{self.path}: bad attribute list near {name!r}")


def parse(path: Path, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"namespace", "root", "enums", "unions", "tables"} of `path` and its includes (qualified names)."""
    schema = schema or {"enums": {}, "unions": {}, "tables": {}, "root": None, "files": []}
    schema["files"].append(path.name)
    p = _Parser(_tokens(path.read_text()), path)
    ns = ""
    tables_here: list[tuple[str, list[tuple[str, str, Any, dict[str, Any]]]]] = []
    while p.peek():
        kw = p.next()
        if kw == "namespace":
            ns = p.next()
            p.expect(";")
        elif kw == "include":
            parse(path.parent / p.next().strip('"'), schema)
            p.expect(";")
        elif kw in ("attribute", "root_type", "file_identifier", "file_extension"):
            value = p.next()
            p.expect(";")
            if kw == "root_type":
                schema["root"] = _qualify(value, ns)
        elif kw == "enum":
            name = _qualify(p.next(), ns)
            p.expect(":")
            base = p.next()
            if base not in SCALARS or base in ("bool", "float", "double"):
                raise SchemaError(f"{path}: enum {name} needs an integer base type")
            p.attrs()
            schema["enums"][name] = {"base": base, "values": _members(p, numbered=True)}
        elif kw == "union":
            name = _qualify(p.next(), ns)
            members = _members(p, numbered=False)
            schema["unions"][name] = {m: v for m, v in members.items()}
        elif kw == "table":
            name = _qualify(p.next(), ns)
            p.attrs()
            tables_here.append((name, _fields(p)))
        else:
            raise SchemaError(
                f"{path}: unsupported schema construct {kw!r} (structs are not wire types here)"
            )
    for name, fields in tables_here:
        schema["tables"][name] = _resolve(schema, ns, name, fields)
    return schema


def _qualify(name: str, ns: str) -> str:
    return name if "." in name or not ns else f"{ns}.{name}"


def _members(p: _Parser, numbered: bool) -> dict[str, int]:
    p.expect("{")
    out: dict[str, int] = {} if numbered else {"NONE": 0}
    value = 0 if numbered else 1
    while (tok := p.next()) != "}":
        if tok == ",":
            continue
        if p.peek() == "=":
            p.next()
            value = int(p.next())
        out[tok] = value
        value += 1
    return out


def _fields(p: _Parser) -> list[tuple[str, str, Any, dict[str, Any]]]:
    p.expect("{")
    out = []
    while (name := p.next()) != "}":
        p.expect(":")
        kind = p.next()
        if kind == "[":
            kind = "[" + p.next() + "]"
            p.expect("]")
        default: Any = None
        if p.peek() == "=":
            p.next()
            raw = p.next()
            default = {"true": 1, "false": 0}.get(raw, raw)
        attrs = p.attrs()
        unknown = set(attrs) - _ENFORCED
        if unknown:
            raise SchemaError(f"{p.path}: field {name}: attributes {sorted(unknown)} are not supported")
        p.expect(";")
        out.append((name, kind, default, attrs))
    return out


def _resolve(
    schema: dict[str, Any], ns: str, table: str, fields: list[tuple[str, str, Any, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Field dicts {name, slot, type, elem, ref, default, attrs}: type one of scalar names, "string",
    "enum", "table", "union_type", "union", "vector" (elem: scalar name, "string" or "table")."""
    out: list[dict[str, Any]] = []
    slot = 0
    for name, kind, default, attrs in fields:
        f: dict[str, Any] = {"name": name, "attrs": attrs}
        vector = kind.startswith("[")
        base = kind[1:-1] if vector else kind
        if base in SCALARS or base == "string":
            typ, ref = base, None
        else:
            ref = _lookup(schema, ns, base, table)
            typ = "enum" if ref in schema["enums"] else "union" if ref in schema["unions"] else "table"
        if vector:
            if typ in ("union", "enum") and typ == "union":
                raise SchemaError(f"{table}.{name}: vectors of unions are not supported")
            elem = schema["enums"][ref]["base"] if typ == "enum" else typ
            out.append({**f, "slot": slot, "type": "vector", "elem": elem, "ref": ref, "default": None})
        elif typ == "union":
            out.append({"name": name + "_type", "attrs": {}, "slot": slot, "type": "union_type",
                        "elem": "ubyte", "ref": ref, "default": 0})  # fmt: skip
            slot += 1
            out.append({**f, "slot": slot, "type": "union", "elem": None, "ref": ref, "default": None})
        elif typ == "enum":
            enum = schema["enums"][ref]
            value = enum["values"][default] if default in enum["values"] else int(default or 0)
            out.append(
                {**f, "slot": slot, "type": "enum", "elem": enum["base"], "ref": ref, "default": value}
            )
        elif typ in SCALARS:
            value = (
                float(default or 0) if typ in ("float", "double", "float32", "float64") else int(default or 0)
            )
            out.append({**f, "slot": slot, "type": "scalar", "elem": typ, "ref": None, "default": value})
        else:
            out.append({**f, "slot": slot, "type": typ, "elem": None, "ref": ref, "default": None})
        slot += 1
    return out


def _lookup(schema: dict[str, Any], ns: str, name: str, where: str) -> str:
    for candidate in (_qualify(name, ns), name):
        if any(candidate in schema[k] for k in ("enums", "unions", "tables")):
            return candidate
    raise SchemaError(f"{where}: unknown type {name!r}")


def render(schema: dict[str, Any], source: str) -> str:
    body = pprint.pformat({k: schema[k] for k in ("root", "enums", "unions", "tables")}, width=110)
    return (
        f'"""Field tables of {source}, written by `make proto` (anvil_core.codec.fbs_schema)."""\n\n'
        f"SCHEMA = {body}\n"
    )


def main(argv: list[str]) -> None:
    src, out_dir = Path(argv[0]), Path(argv[1])
    text = render(parse(src), f"proto/{src.name}")
    (out_dir / f"{src.stem}_schema.py").write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
