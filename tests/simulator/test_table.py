"""``Table``: the Parquet file it writes without pandas reads back, through pandas, as exactly the frame
``to_pandas`` builds (nullable integers, categoricals, NaN stored as null, string runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.results.table import Table

CATEGORIES = ("completed", "in_flight", "rejected")


def sample_table(n: int, seed: int) -> Table:
    rng = np.random.default_rng(seed)
    floats = rng.normal(size=n)
    floats[rng.random(n) < 0.3] = np.nan
    names = np.array(["base", "b", "ünïcode variant"], dtype=object)[np.sort(rng.integers(0, 3, n))]
    return Table(
        {
            "variant": names,
            "request_id": np.arange(n, dtype=np.int64),
            "replica": rng.integers(-1, 4, n).astype(np.int32),
            "outcome": rng.integers(0, 3, n).astype(np.int8),
            "tokens": rng.integers(0, 10_000, n),
            "ttft_ms": floats,
            "rejected": rng.random(n) < 0.5,
        },
        missing={"replica": rng.random(n) < 0.4},
        categories={"outcome": CATEGORIES},
    )


def round_trip(table: Table, path: Path) -> pd.DataFrame:
    table.write_parquet(path)
    return pd.read_parquet(path)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_the_parquet_file_reads_back_as_the_frame(tmp_path_factory: pytest.TempPathFactory, n: int, seed: int) -> None:
    table = sample_table(n, seed)
    folder = tmp_path_factory.mktemp("t")
    back = round_trip(table, folder / "t.parquet")
    table.to_pandas().to_parquet(folder / "pandas.parquet", index=False)
    # as pandas' own file of the frame reads back (an empty categorical loses its categories in Parquet)
    pdt.assert_frame_equal(back, pd.read_parquet(folder / "pandas.parquet"))
    if n:
        pdt.assert_frame_equal(back, table.to_pandas())


def test_columns_keep_their_types_and_missing_values(tmp_path: Path) -> None:
    table = sample_table(200, 1)
    frame = round_trip(table, tmp_path / "t.parquet")
    assert str(frame["replica"].dtype) == "Int32"
    assert isinstance(frame["outcome"].dtype, pd.CategoricalDtype)
    assert list(frame["outcome"].cat.categories) == list(CATEGORIES)
    assert frame["replica"].isna().to_numpy().tolist() == table.missing["replica"].tolist()
    assert frame["variant"].tolist() == table.columns["variant"].tolist()
    # NaN is stored as null, as pandas stores it (other readers see a missing value, not a NaN)
    stored = pq.read_table(tmp_path / "t.parquet")
    assert stored.column("ttft_ms").null_count == int(np.isnan(table.columns["ttft_ms"]).sum())


def test_concat_puts_rows_after_one_another() -> None:
    a, b = sample_table(30, 2), sample_table(20, 3)
    both = Table.concat([a, b])
    assert len(both) == 50
    pdt.assert_frame_equal(both.to_pandas(), pd.concat([a.to_pandas(), b.to_pandas()], ignore_index=True))


def test_inconsistent_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="unequal length"):
        Table({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(ValueError, match="lacks"):
        Table({"a": np.zeros(2)}, missing={"b": np.zeros(2, dtype=bool)})
    with pytest.raises(ValueError, match="different columns"):
        Table.concat([Table({"a": np.zeros(2)}), Table({"b": np.zeros(2)})])


def test_unsigned_nullable_and_foreign_byte_order_columns_read_back(tmp_path: Path) -> None:
    table = Table({"n": np.array([1, 2, 3], dtype=np.uint32), "x": np.arange(3, dtype=">f8"),
                   "i": np.arange(3, dtype=">i8")}, missing={"n": np.array([False, True, False])})
    back = round_trip(table, tmp_path / "t.parquet")
    assert str(back["n"].dtype) == "UInt32" and back["n"].isna().tolist() == [False, True, False]
    assert back["x"].tolist() == [0.0, 1.0, 2.0] and back["i"].tolist() == [0, 1, 2]


def test_a_missing_mask_must_fit_an_integer_column() -> None:
    with pytest.raises(ValueError, match="of its length"):
        Table({"a": np.arange(4)}, missing={"a": np.array([True])})
    with pytest.raises(ValueError, match="integer column"):
        Table({"a": np.zeros(2)}, missing={"a": np.zeros(2, dtype=bool)})
