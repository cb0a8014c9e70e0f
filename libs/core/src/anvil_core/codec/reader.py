"""The verifying reader: one pass over a flatbuffer that checks every offset, length, string, vector
and enum against the buffer and the schema before a value is handed out, and builds flatc's
object-API instances (`InferRequestT`, ...) from what passed.

Checks, per table: the table and its vtable lie inside the buffer, the vtable's size is even and
at least 4, each present field lies inside the table's declared size. Per reference (all flatbuffers
references point forward, so there are no cycles): the target lies inside the buffer. Per string:
its length and its NUL terminator are inside the buffer, it is UTF-8, and the schema's `nonempty` /
`max_len` hold. Per vector: its elements are inside the buffer. Per integer: enum fields hold a
declared value (and at least `min`), others lie in `min..max`. Per union: its type is a member.
Sharing (two references to one object) is legal flatbuffers, so the objects decoded from one buffer
are budgeted (`len(buf) + 64`): a crafted buffer cannot decode into more objects than it has bytes.

Anything else raises `ProtocolError` naming the field and the constraint; nothing else escapes.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

from anvil_core.codec.errors import ProtocolError
from anvil_core.codec.schema import Field, Kind, TableDesc

__all__ = ["decode"]

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_VT_HEAD = struct.Struct("<HH").unpack_from
_SLOTS: dict[int, Any] = {}  # slot count -> unpack_from of that many u16
_VECS: dict[tuple[str, int], Any] = {}  # (format, n) -> unpack_from
_SCALAR, _STRING, _TABLE, _UNION = Kind.SCALAR, Kind.STRING, Kind.TABLE, Kind.UNION
_VEC_SCALAR, _VEC_STRING, _VEC_TABLE = Kind.VEC_SCALAR, Kind.VEC_STRING, Kind.VEC_TABLE


class _Cursor:
    __slots__ = ("budget", "buf", "end")

    def __init__(self, buf: Any, end: int) -> None:
        self.buf = buf
        self.end = end
        self.budget = end + 64


def decode(buf: Any, desc: TableDesc, start: int = 0, end: int | None = None) -> Any:
    """The root table of the flatbuffer in `buf[start:end]` as an instance of `desc.cls`."""
    end = len(buf) if end is None else end
    if end - start < 12:  # root offset + the smallest table (soffset) + the smallest vtable (4 B)
        raise ProtocolError(f"{desc.short}: {end - start} bytes cannot hold a flatbuffer")
    cur = _Cursor(buf, end)
    return _table(cur, start + _U32(buf, start)[0], desc)


def _fail(f: Field, what: str, reason: str = "invalid") -> ProtocolError:
    return ProtocolError(f"{f.where} {what}", reason)


def _table(cur: _Cursor, pos: int, desc: TableDesc) -> Any:
    buf, end = cur.buf, cur.end
    if pos + 4 > end:
        raise ProtocolError(f"{desc.short}: table at byte {pos} lies outside the {end}-byte buffer")
    vt = pos - _I32(buf, pos)[0]
    if vt < 0 or vt + 4 > end:
        raise ProtocolError(f"{desc.short}: vtable at byte {vt} lies outside the {end}-byte buffer")
    vt_len, t_len = _VT_HEAD(buf, vt)
    if vt_len < 4 or vt_len & 1 or vt + vt_len > end or t_len < 4 or pos + t_len > end:
        raise ProtocolError(f"{desc.short}: vtable ({vt_len} B) or table ({t_len} B) overruns the buffer")
    cur.budget -= 1
    if cur.budget < 0:
        raise ProtocolError(f"{desc.short}: more objects than the buffer has bytes", "too_large")
    n = (vt_len - 4) >> 1
    unpack = _SLOTS.get(n)
    if unpack is None:
        unpack = _SLOTS[n] = struct.Struct(f"<{n}H").unpack_from
    offs = unpack(buf, vt + 4)
    readers = _READERS.get(id(desc))
    if readers is None:
        readers = _READERS[id(desc)] = {}
    read = readers.get((t_len, offs))
    if read is None and len(readers) < READERS_PER_TABLE:
        read = readers[(t_len, offs)] = _compile(desc, t_len, offs)
    if read is not None:
        return read(cur, pos, buf)
    return _fields(cur, pos, buf, desc, t_len, offs)


def _fields(cur: _Cursor, pos: int, buf: Any, desc: TableDesc, t_len: int, offs: tuple[int, ...]) -> Any:
    """The table's fields one by one from its vtable's offsets: what ``_compile``'s functions do
    (their reference in the tests), and the path of a table type past READERS_PER_TABLE layouts."""
    n = len(offs)
    out: dict[str, Any] = {}
    for f in desc.fields:
        o = offs[f.slot] if f.slot < n else 0
        if not o:
            if f.absent is not None:
                raise _fail(f, f.absent)
            out[f.attr] = f.default
            continue
        if o + f.size > t_len:
            raise _fail(f, f"at table byte {o} overruns the {t_len}-byte table", "undecodable")
        p = pos + o
        kind = f.kind
        if kind == _SCALAR:
            v = f.st.unpack_from(buf, p)[0]
            if f.allowed is not None:
                if v not in f.allowed:
                    assert f.enum is not None
                    raise _fail(f, f"is {v}; it must be one of {_members(f)}")
            elif (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi):
                raise _fail(f, f"is {v}; it must be in {_bounds(f)}")
            out[f.attr] = v
            continue
        at = p + _U32(buf, p)[0]
        if kind == _STRING:
            out[f.attr] = _string(cur, at, f)
        elif kind == _TABLE:
            assert f.table is not None
            out[f.attr] = _table(cur, at, f.table)
        elif kind == _UNION:
            assert f.union is not None
            member = f.union.get(out[f.attr + "Type"])
            out[f.attr] = None if member is None else _table(cur, at, member)
        else:
            out[f.attr] = _vector(cur, at, f)
    obj: Any = object.__new__(desc.cls)
    obj.__dict__ = out
    return obj


def _string(cur: _Cursor, at: int, f: Field) -> str:
    buf, end = cur.buf, cur.end
    if at + 4 > end:
        raise _fail(f, f"string at byte {at} lies outside the {end}-byte buffer", "undecodable")
    n = _U32(buf, at)[0]
    stop = at + 4 + n
    if stop >= end or buf[stop] != 0:
        raise _fail(
            f, f"string of {n} bytes at byte {at} overruns the buffer or lacks its NUL", "undecodable"
        )
    if f.max_len is not None and n > f.max_len:
        raise _fail(f, f"is {n} bytes; at most {f.max_len} are allowed")
    if f.nonempty and not n:
        raise _fail(f, "is empty; it must be a non-empty string")
    cur.budget -= 1
    try:
        return str(buf[at + 4 : stop], "utf-8")
    except UnicodeDecodeError:
        raise _fail(f, "is not valid UTF-8") from None


def _vector(cur: _Cursor, at: int, f: Field) -> tuple[Any, ...]:
    buf, end = cur.buf, cur.end
    if at + 4 > end:
        raise _fail(f, f"vector at byte {at} lies outside the {end}-byte buffer", "undecodable")
    n = _U32(buf, at)[0]
    first = at + 4
    kind = f.kind
    width = f.st.size if kind == _VEC_SCALAR else 4
    if first + n * width > end:
        raise _fail(f, f"vector of {n} elements at byte {at} overruns the {end}-byte buffer", "undecodable")
    cur.budget -= n
    if cur.budget < 0:
        raise _fail(f, "decodes into more objects than the buffer has bytes", "too_large")
    if kind == _VEC_SCALAR:
        unpack = _VECS.get((f.fmt, n))
        if unpack is None:
            unpack = _VECS[(f.fmt, n)] = struct.Struct(f"<{n}{f.fmt}").unpack_from
        return unpack(buf, first)  # type: ignore[no-any-return]
    out = []
    for i in range(n):
        el = first + 4 * i
        target = el + _U32(buf, el)[0]
        if kind == _VEC_STRING:
            out.append(_string(cur, target, f))
        else:
            assert f.table is not None
            out.append(_table(cur, target, f.table))
    return tuple(out)


def _members(f: Field) -> str:
    assert f.enum is not None and f.allowed is not None
    return ", ".join(f"{f.enum.names[v]}={v}" for v in sorted(f.allowed))


def _bounds(f: Field) -> str:
    return f"{'' if f.lo is None else f.lo}..{'' if f.hi is None else f.hi}"


# Compiled readers: per table type, one function per vtable layout seen ((table size, field
# offsets): the writer gives every message of a type the same layout but for which references are
# present), generated once. A crafted peer can make at most this many per table type; beyond them
# its tables take the generic path (`_fields`), same checks.
READERS_PER_TABLE = 32
_READERS: dict[int, dict[tuple[int, tuple[int, ...]], Any]] = {}


def _compile(desc: TableDesc, t_len: int, offs: tuple[int, ...]) -> Any:
    """A function (cur, pos, buf) -> object that decodes and verifies one table of ``desc`` whose
    vtable holds ``offs`` and whose size is ``t_len`` exactly as ``_fields`` does, field by field in
    the same order with the same checks and messages, as straight-line Python: every present inline
    value (scalars and reference offsets) in one ``unpack_from``, then per field its check or its
    child. The caller has checked the table and vtable against the buffer (``_table``)."""
    n = len(offs)
    ns: dict[str, Any] = {
        "_fail": _fail, "_members": _members, "_bounds": _bounds, "_string": _string,
        "_table": _table, "_vector": _vector, "CLS": desc.cls, "_new": object.__new__,
    }  # fmt: skip
    body: list[str] = []
    values: list[str] = []  # the dict display's items, in field order
    local: dict[str, str] = {}  # attr -> the expression holding its value (a union reads its type's)
    inline: list[tuple[int, str, str]] = []  # (offset, struct format, local) of every value read
    for i, f in enumerate(desc.fields):
        ns[f"F{i}"] = f
        o = offs[f.slot] if f.slot < n else 0
        if not o:
            if f.absent is not None:
                body.append(f"    raise _fail(F{i}, F{i}.absent)")
                break  # nothing after it runs
            ns[f"D{i}"] = f.default
            local[f.attr] = f"D{i}"
            values.append(f"{f.attr!r}: D{i}")
            continue
        if o + f.size > t_len:
            why = f"at table byte {o} overruns the {t_len}-byte table"
            body.append(f"    raise _fail(F{i}, {why!r}, 'undecodable')")
            break
        v = f"v{i}"
        if f.kind == Kind.SCALAR:
            inline.append((o, f.fmt, v))
            if f.allowed is not None:
                ns[f"A{i}"] = f.allowed
                body.append(f"    if {v} not in A{i}:")
                body.append(f"        raise _fail(F{i}, f'is {{{v}}}; it must be one of {{_members(F{i})}}')")
            elif f.lo is not None or f.hi is not None:
                conds = [f"{v} < {f.lo!r}"] if f.lo is not None else []
                conds += [f"{v} > {f.hi!r}"] if f.hi is not None else []
                body.append(f"    if {' or '.join(conds)}:")
                body.append(f"        raise _fail(F{i}, f'is {{{v}}}; it must be in {{_bounds(F{i})}}')")
            local[f.attr] = v
            values.append(f"{f.attr!r}: {v}")
            continue
        inline.append((o, "I", v))
        at = f"pos + {o} + {v}"
        if f.kind == Kind.STRING:  # _string inline where every check passes; else it names the failure
            cap = f" and n <= {f.max_len}" if f.max_len is not None else ""
            body += [
                f"    a = {at}",
                "    n = _U32(buf, a)[0] if a + 4 <= end else -1",
                f"    if n >= {1 if f.nonempty else 0}{cap} and a + 4 + n < end and buf[a + 4 + n] == 0:",
                "        cur.budget -= 1",
                "        try:",
                f"            c{i} = str(buf[a + 4 : a + 4 + n], 'utf-8')",
                "        except UnicodeDecodeError:",
                f"            c{i} = _string(cur, a, F{i})",
                "    else:",
                f"        c{i} = _string(cur, a, F{i})",
            ]
        elif f.kind == Kind.TABLE:
            body.append(f"    c{i} = _table(cur, {at}, F{i}.table)")
        elif f.kind == Kind.UNION:
            body.append(f"    m{i} = F{i}.union.get({local[f.attr + 'Type']})")
            body.append(f"    c{i} = None if m{i} is None else _table(cur, {at}, m{i})")
        else:
            body.append(f"    c{i} = _vector(cur, {at}, F{i})")
        local[f.attr] = f"c{i}"
        values.append(f"{f.attr!r}: c{i}")
    else:  # every field decoded: build the object
        body += ["    obj = _new(CLS)", f"    obj.__dict__ = {{{', '.join(values)}}}", "    return obj"]
    inline.sort()
    if any(a[0] + struct.calcsize("<" + a[1]) > b[0] for a, b in itertools.pairwise(inline)):
        # fields that overlap (legal in a crafted vtable, never written so): read one by one
        return lambda cur, pos, buf: _fields(cur, pos, buf, desc, t_len, offs)
    head = ["def read(cur, pos, buf):", "    end = cur.end"]
    ns["_U32"] = _U32
    if inline:
        fmt, cur_at, names = "<", inline[0][0], []
        for o, ch, name in inline:
            fmt += "x" * (o - cur_at) + ch
            cur_at = o + struct.calcsize("<" + ch)
            names.append(name)
        ns["UNPACK"] = struct.Struct(fmt).unpack_from
        head.append(f"    {', '.join(names)}, = UNPACK(buf, pos + {inline[0][0]})")
    src = "\n".join(head + body)
    exec(compile(src, f"<anvil codec reader {desc.short}>", "exec"), ns)
    return ns["read"]
