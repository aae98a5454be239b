"""Mutated traces never end in a traceback: reading one gives its rows, or one ``ConfigError`` line.

Each case takes the first rows of a shared trace and applies hypothesis-chosen damage: a huge field, bytes
that are not UTF-8, a number far out of range, deeply nested JSON, a cut line, a line of noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.workload.traces import TraceFormat, read_trace, traces_dir

FILES = {
    TraceFormat.AZURE: "azure_llm_2023_conv.csv",
    TraceFormat.MOONCAKE: "mooncake_fast25_conversation.jsonl",
    TraceFormat.VIDUR: "vidur_arxiv_summarization_lengths_llama2tok.csv",
}


def head(trace_format: TraceFormat, lines: int = 12) -> list[bytes]:
    path = traces_dir() / FILES[trace_format]
    if not path.is_file():
        pytest.skip(f"shared traces not found at {traces_dir()} (set FLEETSIM_TRACES)")
    with path.open("rb") as handle:
        return [handle.readline() for _ in range(lines)]


damage = st.one_of(
    st.just(b"x" * 200_000),  # past csv's field-size limit
    st.just(b"\xe9\xff\xfe latin-1"),
    st.just(b"1" + b"0" * 30),  # 1e30 as a token count or an id
    st.just(b"99999999999999999999999"),
    st.just(b"[" * 100_000 + b"]" * 100_000),
    st.just(b'{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1e30]}'),
    st.just(b'{"timestamp": 1e400, "input_length": -1, "output_length": 2, "hash_ids": []}'),
    st.just(b"\x00\x00\x00"),
    st.just(b",,,,,"),
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace_format=st.sampled_from(list(TraceFormat)), data=st.data())
def test_a_mutated_trace_is_read_or_one_line(trace_format: TraceFormat, data: st.DataObject,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    lines = head(trace_format)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        row = data.draw(st.integers(0, len(lines) - 1), label="row")
        how = data.draw(st.sampled_from(["replace line", "replace field", "cut"]), label="how")
        bad = data.draw(damage, label="damage")
        if how == "replace line":
            lines[row] = bad + b"\n"
        elif how == "cut":
            lines[row] = lines[row][: len(lines[row]) // 2]
        else:
            sep = b"," if trace_format is not TraceFormat.MOONCAKE else b": "
            fields = lines[row].split(sep)
            fields[data.draw(st.integers(0, len(fields) - 1), label="field")] = bad
            lines[row] = sep.join(fields)
    path = tmp_path_factory.mktemp("trace") / FILES[trace_format]
    path.write_bytes(b"".join(lines))
    try:
        rows = read_trace(trace_format, path)
    except ConfigError as err:
        event("ConfigError")
        text = str(err)
        assert "\n" not in text and len(text) < 2000 and text.startswith(str(path))
        return
    event("read")
    assert len(rows) >= 0


def test_deep_json_in_a_mooncake_trace_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}) + "\n"
                    + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_trace(TraceFormat.MOONCAKE, path)


@pytest.mark.parametrize("row", [
    {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [10**30, 2]},
    {"timestamp": 0, "input_length": 10**23, "output_length": 2, "hash_ids": [1]},
    {"timestamp": 0, "input_length": 10**12, "output_length": 2, "hash_ids": []},
])
def test_out_of_range_numbers_in_a_mooncake_row_are_one_line(row: dict[str, object], tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="line 1"):
        read_trace(TraceFormat.MOONCAKE, path)


def test_a_csv_field_past_the_size_limit_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "x" * 200_000 + ",1,1\n")
    with pytest.raises(ConfigError, match="line 2: not a CSV row"):
        read_trace(TraceFormat.AZURE, path)
