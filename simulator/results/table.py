"""A result table as named numpy columns (``Table``) and its two outward forms: a pandas DataFrame (the
Python API, the dashboard, analyses) and a Parquet file written through Arrow without pandas.

Why not just a DataFrame: saving a run is the only thing a small ``fleetsim run`` does with its tables,
and importing pandas costs more than simulating a few hundred requests (about 0.2 s of a 0.3 s start-up).
The Parquet file carries the ``pandas`` schema metadata pandas itself writes (its published storage
format), so ``pandas.read_parquet`` gives back exactly the frame ``to_pandas`` builds: nullable integers,
the categorical, NaN where a float is undefined (stored as null, as pandas stores it).

Must never import pandas at module level, nor call ``pyarrow.array`` (which imports pandas to look for
pandas objects): Arrow arrays are assembled from the numpy buffers themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Table:
    """Equal-length numpy columns, in order, with what a plain array cannot say: which integer values are
    missing and which columns are categorical."""

    columns: Mapping[str, np.ndarray]
    """Name -> values. A string column is a numpy array of ``str``; a categorical one holds int8 codes."""
    missing: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Nullable integer columns: name -> mask, True where the value is missing (its stored value is
    meaningless there)."""
    categories: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Categorical columns: name -> the category each code indexes."""

    def __post_init__(self) -> None:
        lengths = {len(values) for values in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: { {k: len(v) for k, v in self.columns.items()} }")
        unknown = (set(self.missing) | set(self.categories)) - set(self.columns)
        if unknown:
            raise ValueError(f"missing values or categories for columns the table lacks: {sorted(unknown)}")
        for name, mask in self.missing.items():
            values = self.columns[name]
            if values.dtype.kind not in "iu" or mask.dtype != np.bool_ or mask.shape != values.shape:
                raise ValueError(f"column {name!r}: missing values are a boolean mask over an integer column "
                                 f"of its length (a {values.dtype} column, a {mask.dtype} mask of {mask.shape})")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def with_column(self, name: str, values: np.ndarray, *, first: bool = False) -> Table:
        """This table with one more column, at the end or first."""
        columns = {name: values, **self.columns} if first else {**self.columns, name: values}
        return Table(columns, self.missing, self.categories)

    @staticmethod
    def concat(tables: Sequence[Table]) -> Table:
        """The rows of ``tables`` one after another; they have the same columns in the same order."""
        if not tables:
            raise ValueError("no tables to concatenate")
        names = list(tables[0].columns)
        for table in tables[1:]:
            if list(table.columns) != names or table.categories != tables[0].categories:
                raise ValueError("tables with different columns cannot be concatenated")
        columns = {name: np.concatenate([t.columns[name] for t in tables]) for name in names}
        missing = {name: np.concatenate([t.missing.get(name, np.zeros(len(t), dtype=bool)) for t in tables])
                   for name in set().union(*(t.missing for t in tables))}
        return Table(columns, {name: missing[name] for name in names if name in missing}, tables[0].categories)

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd  # here, not at import: see the module docstring

        data: dict[str, object] = {}
        string_dtype = pd.Series(["text"]).dtype  # pandas' own for strings: str from pandas 3 on, object before
        for name, values in self.columns.items():
            if name in self.categories:
                data[name] = pd.Categorical.from_codes(values, categories=pd.Index(list(self.categories[name])))
            elif name in self.missing:
                data[name] = pd.arrays.IntegerArray(values, self.missing[name])
            elif values.dtype.kind == "U" or values.dtype == object:
                data[name] = pd.Series(values, dtype=object).astype(string_dtype)  # that type even when empty
            else:
                data[name] = values
        return pd.DataFrame(data)

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        arrays = [self._arrow_column(name, values) for name, values in self.columns.items()]
        table = pa.Table.from_arrays(arrays, names=list(self.columns))
        return table.replace_schema_metadata({b"pandas": json.dumps(self._pandas_metadata()).encode()})

    def write_parquet(self, path: Path) -> None:
        import pyarrow.parquet as pq

        pq.write_table(self.to_arrow(), path)

    def _arrow_column(self, name: str, values: np.ndarray) -> pa.Array:
        import pyarrow as pa

        if name in self.categories:
            codes = _primitive(pa.int8(), np.ascontiguousarray(values, dtype=np.int8), None)
            return pa.DictionaryArray.from_arrays(codes, _strings(pa.string(), self.categories[name]))
        if values.dtype.kind == "U" or values.dtype == object:
            return _strings(pa.large_string(), values)
        if values.dtype.kind == "f":
            return _primitive(pa.from_numpy_dtype(values.dtype), values, np.isnan(values))
        if values.dtype == np.bool_:  # Arrow packs booleans into bits, numpy keeps a byte each
            bits = np.packbits(values, bitorder="little")
            return _primitive(pa.bool_(), bits, self.missing.get(name), length=len(values))
        return _primitive(pa.from_numpy_dtype(values.dtype), values, self.missing.get(name))

    def _pandas_metadata(self) -> dict[str, object]:
        """What pandas writes into a Parquet file's schema so that reading it back rebuilds the frame."""
        import pyarrow as pa

        columns: list[dict[str, object]] = []
        for name, values in self.columns.items():
            entry: dict[str, object] = {"name": name, "field_name": name, "metadata": None}
            if name in self.categories:
                entry |= {"pandas_type": "categorical", "numpy_type": "int8",
                          "metadata": {"num_categories": len(self.categories[name]), "ordered": False}}
            elif values.dtype.kind == "U" or values.dtype == object:
                entry |= {"pandas_type": "unicode", "numpy_type": "object"}
            else:
                dtype = values.dtype.name
                # a nullable integer is pandas' extension type: Int32, UInt64, ...
                nullable = ("UInt" if values.dtype.kind == "u" else "Int") + str(8 * values.dtype.itemsize)
                entry |= {"pandas_type": dtype, "numpy_type": nullable if name in self.missing else dtype}
            columns.append(entry)
        return {"index_columns": [], "column_indexes": [], "columns": columns, "attributes": {},
                "creator": {"library": "pyarrow", "version": pa.__version__}}


def _primitive(arrow_type: pa.DataType, values: np.ndarray, missing: np.ndarray | None,
               length: int | None = None) -> pa.Array:
    """An Arrow array of ``length`` values (``len(values)`` unless given: packed bits are fewer bytes) over
    ``values``' own buffer; nulls where ``missing``."""
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))  # Arrow's buffers are native-endian
    length = len(values) if length is None else length
    if missing is None or not missing.any():
        return pa.Array.from_buffers(arrow_type, length, [None, pa.py_buffer(values)], null_count=0)
    validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(arrow_type, length, [validity, pa.py_buffer(values)],
                                 null_count=int(missing.sum()))


def _strings(arrow_type: pa.DataType, values: Sequence[str] | np.ndarray) -> pa.Array:
    """A (large_)string Arrow array of ``values``: their UTF-8 bytes end to end and the offsets between.
    Runs of one value (a table's ``variant`` column) are encoded once per run, not once per row."""
    import pyarrow as pa

    values = np.asarray(values, dtype=object)
    n = len(values)
    starts = [0, *(np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()] if n else []
    ends = [*starts[1:], n] if n else []
    lengths = np.zeros(n, dtype=np.int64)
    parts = []
    for start, end in zip(starts, ends, strict=True):
        encoded = str(values[start]).encode()
        lengths[start:end] = len(encoded)
        parts.append(encoded * (end - start))
    offsets = np.zeros(n + 1, dtype=np.int64 if arrow_type == pa.large_string() else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(parts))],
                                 null_count=0)
