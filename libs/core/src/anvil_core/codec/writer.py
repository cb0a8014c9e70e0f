"""The writer: object-API instances (`InferRequestT`, ...) to standard flatbuffers, front to back.

The `flatbuffers` package's Builder writes back to front one scalar at a time (~110 µs per
InferRequest in Python). This writer lays each table out in one pass with `struct.pack_into`, from
a layout computed once per table from the schema descriptors:

    [u32 root offset] [vtable] [table] [children of the table, each the same way] ...

Every reference points forward, as the format requires; a vtable sits just before its table;
scalars are aligned to their size, strings and vectors to 4, vectors of 8-byte scalars so that their
elements are 8-aligned, tables to their widest field. Every scalar field is written even when it
holds its default, so a message's size depends only on its strings and vectors, never on its
numbers (ZeroCopy's slot planning relies on that). flatc's generated accessors read the result;
tests check that, and that the reader returns what was written.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from anvil_core.codec.schema import Field, Kind, TableDesc

__all__ = ["encode"]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class _Layout:
    """Where each field of one table type sits inside the table, and how to write its vtable."""

    __slots__ = ("align", "offsets", "refs", "scalars", "size", "vt_fmt", "vt_len")

    def __init__(self, desc: TableDesc) -> None:
        pos = 4  # after the soffset to the vtable
        placed: dict[int, int] = {}
        for f in sorted(desc.fields, key=lambda f: -f.size):
            pos = (pos + f.size - 1) // f.size * f.size
            placed[f.slot] = pos
            pos += f.size
        self.align = max([4, *(f.size for f in desc.fields)])
        self.size = (pos + self.align - 1) // self.align * self.align
        self.offsets = [placed.get(s, 0) for s in range(desc.n_slots)]
        self.scalars = [
            (f.attr, f.st, placed[f.slot], f.default) for f in desc.fields if f.kind == Kind.SCALAR
        ]
        self.refs = [(f, placed[f.slot]) for f in desc.fields if f.kind != Kind.SCALAR]
        self.vt_len = 4 + 2 * desc.n_slots
        self.vt_fmt = struct.Struct(f"<{2 + desc.n_slots}H")


_LAYOUTS: dict[int, _Layout] = {}


def encode(obj: Any, desc: TableDesc, size_prefixed: bool = False) -> bytes:
    """The finished buffer with `obj` (an instance of `desc.cls`) as its root table; with
    `size_prefixed`, preceded by its length as a u32 (what ZeroCopy's slot blocks carry)."""
    buf = bytearray(8 if size_prefixed else 4)
    at = len(buf) - 4
    _U32.pack_into(buf, at, _table(buf, obj, desc) - at)
    if size_prefixed:
        _U32.pack_into(buf, 0, len(buf) - 4)
    return bytes(buf)


def _pad(buf: bytearray, align: int, phase: int = 0) -> None:
    """Zero-pad so that len(buf) % align == phase."""
    gap = (phase - len(buf)) % align
    if gap:
        buf += bytes(gap)


def _table(buf: bytearray, obj: Any, desc: TableDesc) -> int:
    """Lay out ``obj``'s table (vtable, table, then its children) at the end of ``buf``; its position."""
    write = _WRITERS.get(id(desc))
    if write is None:
        write = _WRITERS[id(desc)] = _compile(desc)
    return write(buf, obj)


def _table_generic(buf: bytearray, obj: Any, desc: TableDesc) -> int:
    """What ``_compile``'s functions do, field by field from the layout: their reference (tests
    compare the bytes of both)."""
    lay = _LAYOUTS.get(id(desc))
    if lay is None:
        lay = _LAYOUTS[id(desc)] = _Layout(desc)
    values = obj.__dict__
    vt = list(lay.offsets)
    refs = []
    for f, off in lay.refs:
        value = values.get(f.attr)
        if value is None:
            vt[f.slot] = 0
        else:
            refs.append((f, off, value))
    _pad(buf, 2)
    vt_pos = len(buf)
    buf += lay.vt_fmt.pack(lay.vt_len, lay.size, *vt)
    _pad(buf, lay.align)
    pos = len(buf)
    buf += bytes(lay.size)
    _I32.pack_into(buf, pos, pos - vt_pos)
    for attr, st, off, default in lay.scalars:
        value = values.get(attr)
        st.pack_into(buf, pos + off, default if value is None else value)
    for f, off, value in refs:
        at = pos + off
        _U32.pack_into(buf, at, _child(buf, f, value, values) - at)
    return pos


def _string(buf: bytearray, value: str | bytes) -> int:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    _pad(buf, 4)
    pos = len(buf)
    buf += _U32.pack(len(raw))
    buf += raw
    buf += b"\0"
    return pos


def _child(buf: bytearray, f: Field, value: Any, values: dict[str, Any]) -> int:
    kind = f.kind
    if kind == Kind.STRING:
        return _string(buf, value)
    if kind == Kind.TABLE:
        assert f.table is not None
        return _table(buf, value, f.table)
    if kind == Kind.UNION:
        assert f.union is not None
        member = f.union.get(values.get(f.attr + "Type") or 0)
        if member is None:
            raise ValueError(f"{f.where}: a body needs a known {f.attr}Type")
        return _table(buf, value, member)
    n = len(value)
    if kind == Kind.VEC_SCALAR:
        size = f.st.size
        _pad(buf, max(4, size), 4 if size == 8 else 0)  # 8-byte elements start 8-aligned
        pos = len(buf)
        buf += _U32.pack(n)
        buf += struct.pack(f"<{n}{f.fmt}", *value)
        return pos
    _pad(buf, 4)
    pos = len(buf)
    buf += _U32.pack(n)
    slots = len(buf)
    buf += bytes(4 * n)
    for i, item in enumerate(value):
        at = slots + 4 * i
        if kind == Kind.VEC_STRING:
            child = _string(buf, item)
        else:
            assert f.table is not None
            child = _table(buf, item, f.table)
        _U32.pack_into(buf, at, child - at)
    return pos


_WRITERS: dict[int, Callable[[bytearray, Any], int]] = {}


def _compile(desc: TableDesc) -> Callable[[bytearray, Any], int]:
    """A function that writes one table of ``desc`` exactly as ``_table_generic`` does (same bytes),
    as straight-line Python generated once per table type: the vtable, the padding before the table
    and the table itself (soffset, every scalar, zeroed references) in one ``struct.pack`` (one
    precompiled format per padding length), then each present child and its reference. The generic
    path costs a dict lookup, a call and a `pack_into` per field (~20 µs per envelope)."""
    lay = _LAYOUTS.get(id(desc))
    if lay is None:
        lay = _LAYOUTS[id(desc)] = _Layout(desc)
    ns: dict[str, Any] = {"_U32": _U32, "_child": _child}
    lines = ["def write(buf, obj):", "    d = obj.__dict__"]
    ref_var: dict[int, str] = {}  # slot -> local holding the child value
    for i, (f, _off) in enumerate(lay.refs):
        ref_var[f.slot] = f"r{i}"
        lines.append(f"    r{i} = d.get({f.attr!r})")
    # the table's fields in offset order: scalars by value, references as 0 (patched below)
    fields = sorted(desc.fields, key=lambda f: lay.offsets[f.slot])
    fmt, cur, args = "i", 4, ["pos - vt_pos"]
    for j, f in enumerate(fields):
        off = lay.offsets[f.slot]
        fmt += "x" * (off - cur)
        if f.kind == Kind.SCALAR:
            fmt += f.fmt
            ns[f"D{j}"] = f.default
            lines.append(f"    s{j} = d.get({f.attr!r})")
            lines.append(f"    if s{j} is None:")
            lines.append(f"        s{j} = D{j}")
            args.append(f"s{j}")
        else:
            fmt += "I"
            args.append("0")
        cur = off + f.size
    fmt += "x" * (lay.size - cur)
    vt_args = [str(lay.vt_len), str(lay.size)]
    for slot in range(desc.n_slots):
        off = lay.offsets[slot]
        var = ref_var.get(slot)
        vt_args.append(f"({off} if {var} is not None else 0)" if var is not None else str(off))
    vt_fmt = f"{2 + desc.n_slots}H"
    ns["PACKS"] = tuple(struct.Struct(f"<{vt_fmt}{'x' * gap}{fmt}").pack for gap in range(lay.align))
    lines += [
        "    if len(buf) & 1:",
        "        buf += b'\\0'",
        "    vt_pos = len(buf)",
        f"    gap = -(vt_pos + {lay.vt_len}) % {lay.align}",
        f"    pos = vt_pos + {lay.vt_len} + gap",
        f"    buf += PACKS[gap]({', '.join(vt_args + args)})",
    ]
    ns["_LEN"] = _U32.pack
    for i, (f, off) in enumerate(lay.refs):
        ns[f"F{i}"] = f
        lines += [f"    if r{i} is not None:", f"        at = pos + {off}"]
        if f.kind == Kind.STRING:  # _string inline: 4-aligned length, bytes, NUL
            lines += [
                f"        raw = r{i}.encode() if type(r{i}) is str else bytes(r{i})",
                "        gap = -len(buf) % 4",
                "        if gap:",
                "            buf += bytes(gap)",
                "        _U32.pack_into(buf, at, len(buf) - at)",
                "        buf += _LEN(len(raw))",
                "        buf += raw",
                "        buf += b'\\0'",
            ]
        else:
            lines.append(f"        _U32.pack_into(buf, at, _child(buf, F{i}, r{i}, d) - at)")
    lines.append("    return pos")
    exec(compile("\n".join(lines), f"<anvil codec writer {desc.short}>", "exec"), ns)
    fn: Callable[[bytearray, Any], int] = ns["write"]
    return fn
