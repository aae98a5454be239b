"""Traces a user can reach: where ``${traces}`` looks, the catalogue of public traces, ``fleetsim traces``
and its checked download, and the error a missing trace gives."""

from __future__ import annotations

import io
import re
import shutil
import urllib.error
from pathlib import Path

import pytest

from simulator.cli.main import main
from simulator.cli.traces import scenarios_using
from simulator.errors import ConfigError
from simulator.workload import trace_catalogue
from simulator.workload.trace_catalogue import download, file_sha256, load_catalogue
from simulator.workload.trace_sources import resolve_trace_path, trace_folders, traces_dir

SHARED = traces_dir()
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
CONV = "azure_llm_2023_conv.csv"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.delenv("FLEETSIM_TRACES", raising=False)
    monkeypatch.setenv("FLEETSIM_TRACE_CACHE", str(folder))
    return folder


def test_traces_token_looks_in_shared_then_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert trace_folders() == (SHARED, cache)
    cache.mkdir()
    (cache / "only-cached.csv").write_text("x\n")
    assert resolve_trace_path("${traces}/only-cached.csv") == cache / "only-cached.csv"
    if (SHARED / CONV).is_file():  # a file in both: the shared copy wins
        (cache / CONV).write_text("x\n")
        assert resolve_trace_path(f"${{traces}}/{CONV}") == SHARED / CONV
    assert resolve_trace_path("${traces}/nowhere.csv") == SHARED / "nowhere.csv"
    monkeypatch.setenv("FLEETSIM_TRACES", str(cache))  # an explicit folder is the only one searched
    assert trace_folders() == (cache,)


def test_every_trace_a_shipped_scenario_names_is_in_the_catalogue() -> None:
    used = scenarios_using(SCENARIOS)
    assert used, "the shipped scenarios replay traces"
    assert set(used) <= set(load_catalogue())
    assert used[CONV] == ["scenarios/azure_conv.yaml"]


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")
def test_catalogue_checksums_are_the_shared_files() -> None:
    for name, source in load_catalogue().items():
        path = SHARED / name
        assert path.stat().st_size == source.size_bytes, name
        assert file_sha256(path) == source.sha256, name


def published(name: str, content: bytes | None = None):  # type: ignore[no-untyped-def]
    """An opener serving ``content`` (default: the shared copy of ``name``) for any URL."""
    data = content if content is not None else (SHARED / name).read_bytes()
    opened: list[str] = []

    def open_url(url: str) -> io.BytesIO:
        opened.append(url)
        return io.BytesIO(data)

    open_url.opened = opened  # type: ignore[attr-defined]
    return open_url


@pytest.mark.skipif(not (SHARED / CONV).is_file(), reason=f"shared traces not found at {SHARED}")
def test_download_checks_the_sha256_and_leaves_nothing_on_failure(cache: Path) -> None:
    with pytest.raises(ConfigError, match="not the published file"):
        download(CONV, open_url=published(CONV, b"TIMESTAMP,ContextTokens,GeneratedTokens\n"))
    assert not list(cache.iterdir()), "a corrupted download leaves no file and no temporary"
    too_long = (SHARED / CONV).read_bytes() + b"x"
    with pytest.raises(ConfigError, match="sends more than"):
        download(CONV, open_url=published(CONV, too_long))
    assert not list(cache.iterdir())

    opener = published(CONV)
    path = download(CONV, open_url=opener)
    assert path == cache / CONV and file_sha256(path) == load_catalogue()[CONV].sha256
    assert opener.opened == [load_catalogue()[CONV].url]
    again = published(CONV)
    assert download(CONV, open_url=again) == path and again.opened == [], "a good copy is not fetched again"
    assert [p.name for p in cache.iterdir()] == [CONV]


def test_no_network_is_one_error_and_leaves_nothing(cache: Path) -> None:
    def offline(url: str) -> io.BytesIO:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    with pytest.raises(ConfigError, match=r"cannot download https://raw\.githubusercontent\.com/.*name resolution"):
        download(CONV, open_url=offline)
    assert not list(cache.iterdir())


def test_download_of_an_unknown_name_or_into_an_unwritable_folder_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("no public trace named 'nope.csv'; known: azure_llm")):
        download("nope.csv", tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write the trace"):
        download(CONV, blocker / "sub", open_url=published(CONV, b""))


@pytest.mark.skipif(not (SHARED / CONV).is_file(), reason=f"shared traces not found at {SHARED}")
def test_a_scenario_finds_a_downloaded_trace_and_a_missing_one_says_how_to_get_it(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A user without ../shared: the folder $FLEETSIM_TRACES names is empty, and is where downloads go.
    mine = tmp_path / "mine"
    monkeypatch.setenv("FLEETSIM_TRACES", str(mine))
    args = ["run", str(SCENARIOS / "azure_conv.yaml"), "--set", "workload.num_requests=20",
            "--out", str(tmp_path / "out"), "--quiet", "--summary-only"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "trace file not found" in err
    assert f"`fleetsim traces --download {CONV}` fetches one into {mine}" in err

    assert main(["traces"]) == 0
    listing = capsys.readouterr().out
    assert f"{CONV}  (azure; used by scenarios/azure_conv.yaml)" in listing
    assert f"missing  get it with: fleetsim traces --download {CONV}" in listing
    assert load_catalogue()[CONV].url in listing and load_catalogue()[CONV].sha256 in listing

    monkeypatch.setattr(trace_catalogue, "_open_url", published(CONV))
    assert main(["traces", "--download", CONV]) == 0
    assert f"{CONV}: {mine / CONV} (sha256 checked)" in capsys.readouterr().out
    assert main(args) == 0
    assert main(["traces"]) == 0
    assert f"here     {mine / CONV} (checksum ok)" in capsys.readouterr().out


def test_traces_listing_flags_a_changed_file(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETSIM_TRACES", str(cache))
    cache.mkdir()
    (cache / CONV).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert main(["traces"]) == 0
    assert "CHECKSUM DIFFERS from the published file" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("sha256sum") is None or not (SHARED / CONV).is_file(),
                    reason="needs sha256sum and the shared traces")
def test_the_printed_command_checks_the_same_sha256(tmp_path: Path) -> None:
    import subprocess

    command = trace_catalogue.download_command(CONV, tmp_path)
    assert command.startswith(f"curl -fL --create-dirs -o {tmp_path / CONV} https://raw.githubusercontent.com/")
    check = command.split(" && ", 1)[1]
    shutil.copy(SHARED / CONV, tmp_path / CONV)  # what curl would have written
    assert subprocess.run(["bash", "-c", check], capture_output=True).returncode == 0
    (tmp_path / CONV).write_text("changed\n")
    assert subprocess.run(["bash", "-c", check], capture_output=True).returncode != 0
