"""The ``fleetsim`` command line: bad input is one line on stderr and exit status 2, never a traceback;
results are never written over an existing folder; --set, --seed, profiles and policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli.main import COMMANDS, EXIT_USAGE, PLUGINS, build_parser, main
from simulator.core.presets import PRESETS
from simulator.cost.profile import list_profiles
from simulator.fleet.router import ROUTERS

TINY: dict[str, Any] = {
    "schema_version": 1,
    "name": "tiny",
    "description": "Does the CLI work?",
    "seed": 1,
    "workload": {
        "num_requests": 40,
        "arrival": {"process": "poisson", "rate_rps": 20},
        "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.5, "max": 2000},
        "output_tokens": {"dist": "uniform", "low": 5, "high": 60},
    },
    "fleet": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
}


def write(folder: Path, data: dict[str, Any] | str, name: str = "scenario.yaml") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def fleetsim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_ok(capsys: pytest.CaptureFixture[str], scenario: Path, out: Path, *extra: str) -> dict[str, Any]:
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet", *extra)
    assert code == 0, stderr
    assert "report:" in stdout
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def assert_one_line_error(code: int, stdout: str, stderr: str, *needles: str) -> None:
    assert code == EXIT_USAGE
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fleetsim: error: ")
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


# ----- bad input --------------------------------------------------------------------------------------------


def with_(**sections: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(TINY))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


BAD: dict[str, tuple[dict[str, Any] | str, tuple[str, ...]]] = {
    "malformed yaml": ("schema_version: 1\nname: x\nworkload: {num_requests: 3\n", ("line 4", "not valid YAML")),
    "unknown key": (with_(engine={"batchng": "static"}), ("engine.batchng", "did you mean 'batching'")),
    "wrong type": (with_(fleet={"replicas": "four"}), ("fleet.replicas", "'four'")),
    "model does not fit": (
        with_(fleet={"hardware": "H100", "model": "llama-3-70b", "tp": 1, "profile": None}),
        ("fleet.tp", "does not fit"),
    ),
    "block size": (with_(engine={"kv": {"block_size": 24}}), ("engine.kv.block_size", "power of two")),
    "missing section": ({"schema_version": 1, "name": "x"}, ("workload",)),
    "wrong schema version": ({**TINY, "schema_version": 2}, ("schema_version",)),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenario_is_one_line_and_status_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, needles = BAD[case]
    scenario = write(tmp_path, data)
    out = tmp_path / "out"
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet")
    assert_one_line_error(code, stdout, stderr, str(scenario), *needles)
    assert not out.exists(), "a failed run must not leave an output folder behind"


def test_bad_trace_row_names_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,1O9\n"
    )
    scenario = write(tmp_path, {"schema_version": 1, "name": "t", "workload": {"trace": {"format": "azure",
                                                                                          "path": "trace.csv"}},
                                "fleet": {"profile": "h200-llama-3-8b-tp1-analytic"}})
    out = tmp_path / "out"
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet")
    assert_one_line_error(code, stdout, stderr, "trace.csv", "GeneratedTokens", "line 3", "'1O9'")
    assert not out.exists()


def test_missing_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, {"schema_version": 1, "name": "t",
                                "workload": {"trace": {"format": "mooncake", "path": "nowhere.jsonl"}}})
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(code, stdout, stderr, "nowhere.jsonl", "not found")


def test_missing_scenario_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = fleetsim(capsys, "run", str(tmp_path / "absent.yaml"), "--quiet")
    assert_one_line_error(code, stdout, stderr, "absent.yaml")


@pytest.mark.parametrize(("item", "needles"), [
    ("engine.kv.num_block=10", ("engine.kv.num_block", "did you mean 'num_blocks'")),
    ("fleet.replicas=-1", ("fleet.replicas",)),
    ("nonsense", ("--set expects",)),
])
def test_bad_override(item: str, needles: tuple[str, ...], tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--set", item, "--out", str(tmp_path / "o"))
    assert_one_line_error(code, stdout, stderr, *needles)


def test_existing_output_folder_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("mine\n")
    (out / "notes.txt").write_text("keep me\n")
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet")
    assert_one_line_error(code, stdout, stderr, str(out), "not empty")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "summary.json"]
    assert (out / "summary.json").read_text() == "mine\n"
    assert (out / "notes.txt").read_text() == "keep me\n"
    # --overwrite replaces our own files and leaves the user's alone.
    run_ok(capsys, scenario, out, "--overwrite")
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert json.loads((out / "summary.json").read_text())["scenario_name"] == "tiny"


def test_an_existing_empty_folder_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    run_ok(capsys, write(tmp_path, TINY), out)
    assert {"summary.json", "report.html"} <= {p.name for p in out.iterdir()}


# ----- a good run ---------------------------------------------------------------------------------------


def test_run_prints_table_and_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, {**TINY, "variants": {"a": {}, "b": {"engine.batching": "static"}}})
    out = tmp_path / "out"
    code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet")
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].split()[0] == "variant"
    assert [line.split()[0] for line in lines[1:3]] == ["a", "b"]
    assert "analytic" in stdout, "an analytic profile says so"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["variants"]) == {"a", "b"}
    for variant in summary["variants"].values():
        assert variant["requests_completed"] == 40
    assert (out / "report.html").stat().st_size > 0


def test_summary_only_and_no_report_write_less_and_never_keep_an_old_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(tmp_path, TINY)
    out = tmp_path / "out"
    run_ok(capsys, scenario, out)
    full = json.loads((out / "summary.json").read_text())
    (out / "notes.txt").write_text("mine")
    code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet", "--overwrite",
                               "--no-report")
    assert code == 0, stderr
    names = {p.name for p in out.iterdir()}
    assert "report.html" not in names and "summary.json" in names and "notes.txt" in names  # the user's file kept
    assert any(n.startswith("requests.") for n in names)
    code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(out), "--quiet", "--overwrite",
                               "--summary-only")
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == {"summary.json", "notes.txt"}
    assert json.loads((out / "summary.json").read_text()) == full  # the same run, whatever is written
    with pytest.raises(SystemExit) as exit_:  # argparse: the two are exclusive
        fleetsim(capsys, "run", str(scenario), "--summary-only", "--no-report")
    assert exit_.value.code == 2


def test_same_seed_gives_byte_identical_summary_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    run_ok(capsys, scenario, tmp_path / "one")
    run_ok(capsys, scenario, tmp_path / "two")
    assert (tmp_path / "one" / "summary.json").read_bytes() == (tmp_path / "two" / "summary.json").read_bytes()


def test_seed_flag_overrides_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    base = run_ok(capsys, scenario, tmp_path / "base")
    seeded = run_ok(capsys, scenario, tmp_path / "seeded", "--seed", "9")
    same = run_ok(capsys, write(tmp_path, {**TINY, "seed": 9}, "nine.yaml"), tmp_path / "same")
    assert base["scenario"]["base"]["seed"] == 1
    assert seeded["scenario"]["base"]["seed"] == 9
    assert seeded["variants"] != base["variants"]
    assert seeded["variants"] == same["variants"]


def test_set_overrides_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, TINY)
    data = run_ok(capsys, scenario, tmp_path / "out", "--set", "workload.num_requests=12",
                  "--set", "fleet.replicas=3", "--set", "engine.batching=static")
    record = data["scenario"]["base"]
    assert record["workload"]["num_requests"] == 12
    assert record["fleet"]["replicas"] == 3
    assert record["engine"]["batching"] == "static"
    assert data["variants"]["base"]["requests_arrived"] == 12
    assert data["variants"]["base"]["num_gpus"] == 3


def test_variant_runs_only_the_variants_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--variant (repeated) runs those variants, in the scenario's order, each exactly as in the whole run;
    a name the scenario lacks is one line naming the closest and every variant, and nothing is written."""
    variants = {"one": {"fleet": {"replicas": 1}}, "three": {"fleet": {"replicas": 3}},
                "static": {"engine.batching": "static"}}
    scenario = write(tmp_path, {**TINY, "variants": variants})

    def summary(out: str, *extra: str) -> dict[str, Any]:
        code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / out), "--quiet",
                                   "--summary-only", *extra)
        assert code == 0, stderr
        data: dict[str, Any] = json.loads((tmp_path / out / "summary.json").read_text())
        return data

    whole = summary("all")
    picked = summary("some", "--variant", "static", "--variant", "one")
    assert list(picked["variants"]) == ["one", "static"]
    assert list(picked["scenario"]) == ["one", "static"]
    for name in ("one", "static"):
        assert picked["variants"][name] == whole["variants"][name]
    assert list(summary("pattern", "--variant", "[ot]*", "--variant", "one")["variants"]) == ["one", "three"]
    for wrong, needles in (("thre", ("no variant 'thre'", "did you mean 'three'")), ("x*", ("no variant 'x*'",))):
        code, stdout, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / "none"), "--variant",
                                        wrong)
        assert_one_line_error(code, stdout, stderr, *needles, "one, three, static")
        assert not (tmp_path / "none").exists()
    scenario = write(tmp_path, TINY, "plain.yaml")  # no variants: its one variant is base
    assert list(summary("base", "--variant", "base")["variants"]) == ["base"]


def test_default_output_folder_never_reuses_an_existing_one(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scenario = write(tmp_path, TINY)
    for _ in range(2):
        code, _, stderr = fleetsim(capsys, "run", str(scenario), "--quiet", "--set", "workload.num_requests=5")
        assert code == 0, stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny", "tiny-2"]


# ----- listings -----------------------------------------------------------------------------------------


def test_profiles_lists_every_shipped_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = fleetsim(capsys, "profiles")
    assert code == 0, stderr
    header, *lines = stdout.strip().splitlines()
    assert header.split()[:2] == ["profile", "kind"] and header.split()[-1] == "fit"
    assert [line.split()[0] for line in lines] == list_profiles()
    for line in lines:
        assert line.split()[1] in ("measured", "analytic", "fitted-published")
        assert "MAPE" in line or "analytic" in line


def test_policies_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = fleetsim(capsys, "policies")
    assert code == 0, stderr
    families = {}
    for line in stdout.strip().splitlines():
        family, _, names = line.partition("  ")
        families[family.strip()] = {n.strip() for n in names.strip().split(",")}
    assert families["batching"] == {"static", "continuous", "chunked"}
    assert families["kv policy"] == {"paged", "contiguous", "reserve"}
    assert families["preemption"] == {"recompute", "swap"}
    assert families["router"] == set(ROUTERS)
    assert families["preset"] == set(PRESETS)
    assert {"poisson", "gamma", "constant", "curve"} <= families["arrival"]
    assert {"azure", "mooncake", "vidur"} <= families["trace format"]


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == EXIT_USAGE
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run"], ["run", "scenarios/quickstart.yaml", "--bogus"],
                                  ["plan", "scenarios/quickstart.yaml", "--objective", "bogus"]])
def test_a_usage_error_is_one_line_pointing_at_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleetsim") and ": error: " in err and "--help" in err, err


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", "sub/dir", ".hidden", "new\nline"])
def test_a_scenario_name_that_is_a_path_is_refused_before_anything_is_written(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, {**TINY, "name": name})
    assert main(["run", str(path), "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name must be a plain name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.yaml"]  # no runs/ folder, nothing outside


def test_a_negative_seed_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TINY)
    assert main(["run", str(path), "--quiet", "--seed", "-1", "--out", str(tmp_path / "out")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed" in err and not (tmp_path / "out").exists()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("fleetsim ")


def test_a_pure_python_run_says_so_once_unless_silenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from simulator import native

    scenario = write(tmp_path, TINY)
    monkeypatch.setattr(native, "active", lambda: False)
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    monkeypatch.delenv(native.NOTICE_ENV, raising=False)
    code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / "a"), "--quiet")
    assert code == 0 and stderr.count("simulating in pure Python") == 1 and "build-native" in stderr
    monkeypatch.setenv(native.NOTICE_ENV, "1")
    code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / "b"), "--quiet")
    assert code == 0 and "pure Python" not in stderr
    monkeypatch.delenv(native.NOTICE_ENV)
    monkeypatch.setenv(native.PURE_ENV, "1")  # asked for: nothing to tell
    code, _, stderr = fleetsim(capsys, "run", str(scenario), "--out", str(tmp_path / "c"), "--quiet")
    assert code == 0 and "pure Python" not in stderr


def _command_names(parser: Any) -> set[str]:
    (sub,) = [a for a in parser._actions if a.dest == "command"]  # the subparsers action
    return set(sub.choices)


def test_a_command_line_builds_only_its_family_and_the_table_matches_the_families() -> None:
    """``COMMANDS`` (which module registers each simulator command, read without importing them all) says
    what the modules themselves register; naming one builds that family alone, anything else all."""
    everything = _command_names(build_parser(["--help"]))
    assert set(COMMANDS) <= everything and set(COMMANDS.values()) == set(PLUGINS.values())
    assert {"calibrate", "validate"} <= everything  # the calibration package's entry point
    for command, module in COMMANDS.items():
        family = {name for name, owner in COMMANDS.items() if owner == module}
        assert _command_names(build_parser([command, "--help"])) == family, command
    assert _command_names(build_parser(["calibrate"])) == everything


def test_progress_bars_only_for_runs_that_last(capsys: pytest.CaptureFixture[str]) -> None:
    """A variant's bar appears once its run has lasted ``after_s``; a short run prints nothing."""
    from simulator.cli.output import progress_bar

    update, close = progress_bar(True, after_s=3600.0)
    assert update is not None
    for done in range(0, 101, 10):
        update("base", done, 100)
    close()
    assert capsys.readouterr().err == ""
    update, close = progress_bar(True, after_s=0.0)
    assert update is not None
    for done in range(0, 101, 10):
        update("base", done, 100)
        update("other", done // 2, 100)
    close()
    err = capsys.readouterr().err
    assert "100/100" in err and "50/100" in err  # both variants' bars, to the last report
    assert progress_bar(False)[0] is None
