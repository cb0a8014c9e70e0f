"""Host tensors and the datatype table shared by the HTTP edge and the wire.

A `HostTensor` is what every service hands around: a name, a KServe datatype string, a shape and a
numpy array. numpy has no bfloat16, so BF16 tensors carry their raw 16-bit patterns as uint16;
BYTES tensors are 1-D-or-more object arrays of `bytes` and travel length-prefixed (u32 LE + bytes,
the KServe v2 binary encoding).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DATATYPES",
    "HostTensor",
    "TensorError",
    "decode_bytes_elements",
    "element_count",
    "encode_bytes_elements",
    "kserve_datatype",
    "numpy_dtype",
]


class TensorError(ValueError):
    """A tensor whose bytes, shape or datatype disagree; the message states the constraint."""


# KServe v2 datatype -> numpy dtype of the carrier array (None: BYTES, an object array).
DATATYPES: dict[str, np.dtype | None] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": np.dtype(np.uint16),  # raw bfloat16 bit patterns
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": None,
}

_U32 = struct.Struct("<I")
# numpy dtype -> KServe datatype, for arrays whose datatype is not named; uint16 is not here: it is
# BF16's carrier, and a client must say "BF16" rather than have it guessed.
_DATATYPE_OF = {dt: name for name, dt in DATATYPES.items() if dt is not None and name != "BF16"}


def kserve_datatype(dtype: np.dtype) -> str | None:
    """The KServe datatype an array of `dtype` is sent as (object, bytes and str arrays: BYTES), or
    None when it has none (e.g. uint16, complex)."""
    if dtype.kind in "OSU":
        return "BYTES"
    return _DATATYPE_OF.get(dtype)


def numpy_dtype(datatype: str) -> np.dtype | None:
    """The carrier dtype of a KServe datatype; raises TensorError naming the supported ones."""
    try:
        return DATATYPES[datatype]
    except KeyError:
        raise TensorError(f"unsupported datatype {datatype!r}; supported: {', '.join(DATATYPES)}") from None


def element_count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        if d < 0:
            raise TensorError(f"shape {list(shape)} has a negative dimension")
        n *= d
    return n


@dataclass(frozen=True, slots=True)
class HostTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray  # (shape) carrier dtype, C-contiguous

    @classmethod
    def from_array(cls, name: str, datatype: str, array: np.ndarray) -> HostTensor:
        dtype = numpy_dtype(datatype)
        if dtype is None:
            arr = np.asarray(array, dtype=object)
        else:
            arr = np.ascontiguousarray(array, dtype=dtype)
        return cls(name, datatype, tuple(int(d) for d in arr.shape), arr)

    @classmethod
    def from_buffer(
        cls, name: str, datatype: str, shape: tuple[int, ...], buf: memoryview | bytes
    ) -> HostTensor:
        """Wrap raw bytes without copying (fixed-size dtypes) after checking the byte count."""
        dtype = numpy_dtype(datatype)
        count = element_count(shape)
        if dtype is None:
            items = decode_bytes_elements(buf, count)
            return cls(name, datatype, shape, np.array(items, dtype=object).reshape(shape))
        expected = count * dtype.itemsize
        if len(buf) != expected:
            raise TensorError(
                f"tensor {name!r}: {len(buf)} bytes given but shape {list(shape)} of {datatype} "
                f"needs {expected}"
            )
        arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
        return cls(name, datatype, shape, arr)

    def to_bytes_view(self) -> memoryview | bytes:
        """The raw payload: a view of the array's memory, or the length-prefixed BYTES encoding."""
        if self.datatype == "BYTES":
            return encode_bytes_elements(self.data)
        return np.ascontiguousarray(self.data).data.cast("B")

    @property
    def nbytes(self) -> int:
        if self.datatype == "BYTES":
            return len(encode_bytes_elements(self.data))
        return int(self.data.nbytes)


def encode_bytes_elements(array: np.ndarray) -> bytes:
    """Length-prefixed concatenation (u32 LE length, then the bytes) of every element in C order."""
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=object).reshape(-1):
        raw = item if isinstance(item, bytes | bytearray) else str(item).encode()
        parts.append(_U32.pack(len(raw)))
        parts.append(bytes(raw))
    return b"".join(parts)


def decode_bytes_elements(buf: memoryview | bytes, count: int) -> list[bytes]:
    """Inverse of `encode_bytes_elements`; every length is checked against what remains."""
    view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else memoryview(buf)
    items: list[bytes] = []
    pos = 0
    for i in range(count):
        if pos + 4 > len(view):
            raise TensorError(f"BYTES element {i}: length prefix runs past the end of the buffer")
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        if pos + length > len(view):
            raise TensorError(f"BYTES element {i}: {length} bytes declared, {len(view) - pos} remain")
        items.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != len(view):
        raise TensorError(f"BYTES buffer has {len(view) - pos} trailing bytes after {count} elements")
    return items
