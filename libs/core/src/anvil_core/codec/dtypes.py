"""The one datatype table: wire code (`anvil.proto.DType`) <-> KServe name <-> carrier itemsize.

The names are the schema's enum members, which are the KServe v2 names; the numpy carrier of each is
`anvil_core.tensors.DATATYPES`. Every service and the ZeroCopy slot metadata use these three dicts.
"""

from __future__ import annotations

from anvil_core.codec.schema import enum
from anvil_core.tensors import DATATYPES

__all__ = ["DTYPE_CODES", "DTYPE_NAMES", "ITEMSIZE"]

DTYPE_CODES: dict[str, int] = {name: v for name, v in enum("DType").values.items() if name != "INVALID"}
DTYPE_NAMES: dict[int, str] = {v: name for name, v in DTYPE_CODES.items()}
# bytes per element of a fixed-size datatype; 0 for BYTES (length-prefixed, variable)
ITEMSIZE: dict[str, int] = {n: (dt.itemsize if dt is not None else 0) for n, dt in DATATYPES.items()}

if set(DTYPE_CODES) != set(DATATYPES):  # a DType added to the schema needs its numpy carrier
    raise RuntimeError(
        f"DType members {sorted(DTYPE_CODES)} differ from tensors.DATATYPES {sorted(DATATYPES)}"
    )
