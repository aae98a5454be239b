"""Trace readers and trace replay: the shipped traces, bad rows, paths, Mooncake block expansion."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from simulator.errors import ConfigError
from simulator.workload.config import WorkloadConfig
from simulator.workload.generate import generate
from simulator.workload.traces import TraceFormat, read_trace, resolve_trace_path, traces_dir
from simulator.workload.workload import Workload

SHIPPED = traces_dir()
needs_traces = pytest.mark.skipif(not SHIPPED.is_dir(), reason=f"shipped traces not found at {SHIPPED}")


def replay(trace: dict[str, Any], *, block_size: int = 16, base_dir: Path | None = None, **fields: Any) -> Workload:
    cfg = WorkloadConfig.model_validate({"trace": trace, **fields})
    return generate(cfg, seed=0, block_size=block_size, base_dir=base_dir)


def write_mooncake(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_azure(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{t},{c},{g}" for t, c, g in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the shipped traces ------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize(
    ("trace_format", "file", "has_times"),
    [
        ("azure", "azure_llm_2023_code.csv", True),
        ("azure", "azure_llm_2023_conv.csv", True),
        ("mooncake", "mooncake_fast25_conversation.jsonl", True),
        ("mooncake", "mooncake_fast25_synthetic.jsonl", True),
        ("vidur", "vidur_arxiv_summarization_lengths_llama2tok.csv", False),
    ],
)
def test_shipped_traces_read_with_sane_columns(trace_format: str, file: str, has_times: bool) -> None:
    frame = read_trace(trace_format, f"${{traces}}/{file}", max_rows=3000)
    assert len(frame) == 3000
    assert {"arrival_s", "prompt_tokens", "output_tokens"} <= set(frame.columns)
    assert (frame["prompt_tokens"] >= 1).all() and (frame["output_tokens"] >= 0).all()
    if has_times:
        arrival = frame["arrival_s"].to_numpy()
        assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0) and arrival[-1] < 3600
    else:
        assert frame["arrival_s"].isna().all()
    if trace_format == "mooncake":
        counts = frame["hash_ids"].map(len)
        assert (counts == frame["prompt_tokens"].map(lambda n: math.ceil(n / 512))).all()


@needs_traces
def test_azure_replay_rescaled_to_a_rate() -> None:
    trace = {"format": "azure", "path": "${traces}/azure_llm_2023_conv.csv", "rate_rps": 20.0}
    workload = replay(trace, num_requests=5000)
    assert len(workload) == 5000
    # Rescaling is over the whole trace; 5000 of its 19366 rows keep the trace's local rate, so check it
    # on the full replay below and only the order here.
    assert np.all(np.diff(workload.arrival_s) >= 0)
    full = replay(trace)
    assert (len(full) - 1) / (full.arrival_s[-1] - full.arrival_s[0]) == pytest.approx(20.0)


@needs_traces
def test_mooncake_replay_shares_the_common_first_block() -> None:
    trace = {"format": "mooncake", "path": "${traces}/mooncake_fast25_conversation.jsonl"}
    specs = replay(trace, num_requests=200).specs()
    # Block id 0 opens every request of this trace (a shared system prompt): 512 / 16 = 32 engine blocks.
    assert len({s.block_hashes[:32] for s in specs}) == 1
    assert all(len(s.block_hashes) == s.prompt_tokens // 16 for s in specs)


# --- bad rows ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        ("2023-11-16 18:00:00.0,10,5\n2023-11-16 18:00:01.0,ten,5\n", 3, "ContextTokens"),
        ("2023-11-16 18:00:00.0,10,5\nyesterday,10,5\n", 3, "TIMESTAMP"),
        ("2023-11-16 18:00:00.0,10,5\n2023-11-16 18:00:01.0,10,-5\n", 3, "GeneratedTokens"),
        ("2023-11-16 18:00:00.0,10,5\n\n2023-11-16 18:00:01.0,10,5,9\n", 4, None),
    ],
)
def test_bad_azure_row_names_file_line_and_column(tmp_path: Path, body: str, line: int, column: str | None) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(ConfigError) as caught:
        read_trace("azure", path)
    message = str(caught.value)
    assert str(path) in message and f"line {line}" in message
    if column is not None:
        assert caught.value.field == column and column in message


@pytest.mark.parametrize(
    ("bad_line", "column"),
    [
        ('{"timestamp": 5, "input_length": 10, "output_length": 2', None),  # truncated JSON
        ('{"timestamp": 5, "output_length": 2, "hash_ids": []}', "input_length"),
        ('{"timestamp": "soon", "input_length": 10, "output_length": 2}', "timestamp"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [0, -1]}', "hash_ids"),
        ('{"timestamp": 5, "input_length": 2000, "output_length": 2, "hash_ids": [0]}', "hash_ids"),
    ],
)
def test_bad_mooncake_row_names_file_line_and_column(tmp_path: Path, bad_line: str, column: str | None) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}'
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{good}\n{bad_line}\n")
    with pytest.raises(ConfigError) as caught:
        read_trace("mooncake", path)
    assert str(path) in str(caught.value) and "line 3" in str(caught.value)
    if column is None:
        assert "column" in str(caught.value)  # the JSON decoder's character position
    else:
        assert caught.value.field == column


def test_bad_vidur_row_and_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,2\n10.5,2\n")
    with pytest.raises(ConfigError, match="line 3"):
        read_trace("vidur", path)
    path.write_text("prefill,decode\n10,2\n")
    with pytest.raises(ConfigError, match="line 1"):
        read_trace("vidur", path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_trace("azure", tmp_path / "nope.csv")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="no data rows"):
        read_trace("mooncake", empty)


# --- paths -------------------------------------------------------------------------------------------


def test_trace_paths_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETSIM_TRACES", raising=False)
    repo = Path(__file__).resolve().parents[2]
    assert resolve_trace_path("${traces}/a.csv") == repo.parent / "shared" / "data" / "traces" / "a.csv"
    monkeypatch.setenv("FLEETSIM_TRACES", str(tmp_path))
    assert resolve_trace_path("${traces}/a.csv") == tmp_path / "a.csv"
    assert resolve_trace_path("sub/a.csv", tmp_path) == tmp_path / "sub" / "a.csv"
    assert resolve_trace_path("/abs/a.csv", tmp_path) == Path("/abs/a.csv")


# --- replay: time handling and clamps ----------------------------------------------------------------


def azure_rows(count: int) -> list[tuple[str, int, int]]:
    # Irregular gaps (1 to 3 s), and the last row has a zero-token answer.
    seconds = np.cumsum([0] + [1 + i % 3 for i in range(count - 1)])
    return [
        (f"2023-11-16 18:{s // 60:02d}:{s % 60:02d}.5", 100 + i, 0 if i == count - 1 else 5)
        for i, s in enumerate(seconds.tolist())
    ]


def test_replay_time_scale_start_and_clamps(tmp_path: Path) -> None:
    write_azure(tmp_path / "t.csv", azure_rows(100))
    plain = replay({"format": "azure", "path": "t.csv"}, base_dir=tmp_path)
    assert len(plain) == 100 and plain.arrival_s[0] == 0.0
    assert plain.output_tokens[-1] == 1  # zero output tokens count as one
    half = replay({"format": "azure", "path": "t.csv", "time_scale": 0.5}, base_dir=tmp_path)
    np.testing.assert_allclose(half.arrival_s, plain.arrival_s * 0.5)
    late = replay({"format": "azure", "path": "t.csv", "start_s": 100.0}, base_dir=tmp_path)
    kept = plain.arrival_s[plain.arrival_s >= 100.0]
    np.testing.assert_allclose(late.arrival_s, kept - 100.0)
    clamped = replay({"format": "azure", "path": "t.csv", "max_prompt_tokens": 110}, base_dir=tmp_path, duration_s=50.0)
    assert clamped.prompt_tokens.max() == 110 and clamped.arrival_s[-1] < 50.0


def test_rows_stamped_before_the_first_are_replayed_in_time_order_not_dropped(tmp_path: Path) -> None:
    write_azure(tmp_path / "t.csv", [("2023-11-16 18:15:48.0", 374, 44), ("2023-11-16 18:15:46.0", 396, 109),
                                     ("2023-11-16 18:15:47.0", 200, 7)])
    azure = replay({"format": "azure", "path": "t.csv"}, base_dir=tmp_path)
    np.testing.assert_array_equal(azure.arrival_s, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(azure.prompt_tokens, [396, 200, 374])
    write_mooncake(tmp_path / "m.jsonl", [{"timestamp": 10, "input_length": 20, "output_length": 3, "hash_ids": [1]},
                                          {"timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": [2]}])
    mooncake = replay({"format": "mooncake", "path": "m.jsonl"}, base_dir=tmp_path)
    np.testing.assert_array_equal(mooncake.arrival_s, [0.0, 0.01])
    np.testing.assert_array_equal(mooncake.prompt_tokens, [30, 20])


def test_replay_rate_gives_the_asked_mean_rate(tmp_path: Path) -> None:
    write_azure(tmp_path / "t.csv", azure_rows(300))
    workload = replay({"format": "azure", "path": "t.csv", "rate_rps": 7.0}, base_dir=tmp_path)
    mean_gap = np.diff(workload.arrival_s).mean()
    assert 1.0 / mean_gap == pytest.approx(7.0)


def test_vidur_lengths_with_synthetic_arrivals(tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text(
        "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{100 + i},{i}\n" for i in range(50))
    )
    trace = {"format": "vidur", "path": "v.csv"}
    workload = replay(trace, base_dir=tmp_path, arrival={"process": "constant", "rate_rps": 2.0})
    assert len(workload) == 50  # the trace's rows run out: it is not looped
    np.testing.assert_array_equal(workload.prompt_tokens, 100 + np.arange(50))
    np.testing.assert_allclose(workload.arrival_s, np.arange(1, 51) / 2.0)
    # No prefix information: no block is shared.
    hashes = [h for spec in workload for h in spec.block_hashes]
    assert len(hashes) == len(set(hashes)) > 0


@pytest.mark.parametrize(
    "trace",
    [
        {"format": "vidur", "path": "v.csv"},  # no timestamps and no arrival process
        {"format": "azure", "path": "a.csv", "rate_rps": 2.0, "time_scale": 2.0},
        {"format": "azure", "path": "a.csv", "max_requests": 5},  # unknown key
    ],
)
def test_bad_trace_configs_are_rejected(trace: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkloadConfig.model_validate({"trace": trace})


def test_trace_replay_takes_no_synthetic_lengths() -> None:
    with pytest.raises(ValidationError, match="prompt_tokens"):
        WorkloadConfig.model_validate(
            {"trace": {"format": "azure", "path": "a.csv"}, "prompt_tokens": {"dist": "fixed", "value": 5}}
        )


# --- Mooncake block expansion ------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 16, 64, 512, 1024])
def test_mooncake_shared_ids_share_exactly_their_engine_blocks(tmp_path: Path, block_size: int) -> None:
    rows = [
        {"timestamp": 0, "input_length": 2048, "output_length": 5, "hash_ids": [7, 8, 9, 10]},
        {"timestamp": 10, "input_length": 2048, "output_length": 5, "hash_ids": [7, 8, 11, 12]},
        {"timestamp": 20, "input_length": 2048, "output_length": 0, "hash_ids": [7, 8, 9, 10]},
        {"timestamp": 30, "input_length": 2048, "output_length": 5, "hash_ids": [1, 8, 9, 10]},
    ]
    write_mooncake(tmp_path / "m.jsonl", rows)
    a, b, c, d = replay({"format": "mooncake", "path": "m.jsonl"}, block_size=block_size, base_dir=tmp_path).specs()
    assert a.arrival_s == 0.0 and b.arrival_s == 0.01 and c.output_tokens == 1
    assert len(a.block_hashes) == 2048 // block_size
    shared = 2 * 512 // block_size  # two leading ids in common
    common = next(
        (i for i, (x, y) in enumerate(zip(a.block_hashes, b.block_hashes, strict=True)) if x != y), len(a.block_hashes)
    )
    assert common == shared
    assert not set(a.block_hashes[shared:]) & set(b.block_hashes[shared:])
    assert c.block_hashes == a.block_hashes  # same ids, same blocks
    assert not set(d.block_hashes) & set(a.block_hashes)  # a different first id changes every chained hash


def test_mooncake_partial_blocks_and_truncation_get_no_hash(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [3, 4]}]
    write_mooncake(tmp_path / "m.jsonl", rows)
    (spec,) = replay({"format": "mooncake", "path": "m.jsonl"}, base_dir=tmp_path).specs()
    assert len(spec.block_hashes) == 1000 // 16  # the partial 1000 - 992 = 8 tokens have no block
    (short,) = replay({"format": "mooncake", "path": "m.jsonl", "max_prompt_tokens": 100}, base_dir=tmp_path).specs()
    assert short.prompt_tokens == 100 and short.block_hashes == spec.block_hashes[: 100 // 16]
    (big,) = replay({"format": "mooncake", "path": "m.jsonl"}, block_size=1024, base_dir=tmp_path).specs()
    assert big.block_hashes == ()  # 1000 tokens fill no 1024-token block


@pytest.mark.parametrize("trace_format", list(TraceFormat))
def test_an_error_never_shows_the_files_contents(trace_format: TraceFormat, tmp_path: Path) -> None:
    """A scenario pointed at a file that is no trace (say /etc/passwd) gets an error that names the file and
    the line, and quotes at most a short, cut piece of a bad value: never the secret on the line."""
    secret = "root:x:0:0:SECRET-PASSWORD-HASH-0123456789abcdef:/root:/bin/bash"
    path = tmp_path / "passwd"
    path.write_text(f"{secret}\ndaemon:x:1:1:{secret}\n")
    with pytest.raises(ConfigError) as info:
        read_trace(trace_format, path)
    message = str(info.value)
    assert "passwd" in message and "SECRET" not in message and "0123456789" not in message
    assert len(message) < 300
