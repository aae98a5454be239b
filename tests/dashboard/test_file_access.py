"""The dashboard is a server: it reads only the shipped scenarios, profiles and traces and what is uploaded,
shows no file's contents in an error, and listens on loopback unless told otherwise."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest

from dashboard.data import file_access, runs, scenario_base, trace_files
from simulator.errors import ConfigError

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
SECRET = "root:x:0:0:SECRET-CONTENT"
"""What a file outside the allowed folders holds: no error may show it."""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "azure_secret.csv"
    path.parent.mkdir()
    path.write_text(f"{SECRET}\n{SECRET}\n")
    return path


def scenario(**sections: Any) -> dict[str, Any]:
    raw = scenario_base.scratch_base().raw
    raw["workload"]["num_requests"] = 10
    for key, value in sections.items():
        raw[key] = value
    return raw


def outside_cases(secret: Path) -> dict[str, dict[str, Any]]:
    """Scenarios that name a file outside the allowed folders, each a different way."""
    up = "/".join([".."] * 12) + str(secret)
    trace = {"num_requests": 10, "trace": {"format": "azure", "path": str(secret)}}
    return {
        "absolute trace": scenario(workload=trace),
        "traces token climbing out": scenario(workload={**trace, "trace": {"format": "azure",
                                                                           "path": f"${{traces}}/{up}"}}),
        "relative trace of an upload": scenario(workload={**trace, "trace": {"format": "azure", "path": up}}),
        "home-relative trace": scenario(workload={**trace, "trace": {"format": "azure", "path": "~/x.csv"}}),
        "empirical lengths": scenario(workload={
            "num_requests": 10, "arrival": {"process": "poisson", "rate_rps": 5},
            "prompt_tokens": {"dist": "empirical", "format": "azure", "path": str(secret), "column": "prompt_tokens"},
            "output_tokens": {"dist": "fixed", "value": 10}}),
        "profile file": scenario(fleet={"replicas": 1, "profile": str(secret)}),
        "variant override": scenario(variants={"a": {}, "b": {"workload.trace.path": str(secret),
                                                              "workload.trace.format": "azure"}}),
    }


def test_dashboard_refuses_a_scenario_pointing_outside_the_allowed_folders(
        secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The refusal comes before the loader: nothing the scenario names is opened.
    def must_not_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the loader ran on a scenario naming a file outside the allowed folders")

    for case, raw in outside_cases(secret).items():
        with pytest.raises(ConfigError) as caught:
            runs.validate(raw)
        message = str(caught.value)
        assert "the dashboard r" in message and SECRET not in message and "root:" not in message, case
        assert "\n" not in message and len(message) < 400, case

        monkeypatch.setattr(scenario_base, "load_scenario", must_not_load)
        with pytest.raises(ConfigError) as uploaded:
            scenario_base.uploaded_base("mine.yaml", yaml.safe_dump(raw).encode())
        monkeypatch.undo()
        assert str(uploaded.value).startswith("mine.yaml: ") and SECRET not in str(uploaded.value), case
        with pytest.raises(ConfigError):
            runs.simulate(raw)


def test_shipped_scenarios_and_the_public_traces_stay_allowed() -> None:
    for name in scenario_base.list_scenarios():
        base = scenario_base.shipped_base(name)
        file_access.check_paths(base.raw, base.source)
    raw = scenario(workload={"num_requests": 10, "trace": {"format": "azure",
                                                          "path": "${traces}/azure_llm_2023_conv.csv"}})
    file_access.check_paths(raw, None)
    file_access.check_paths(scenario(fleet={"profile": "h200-llama-3-8b-tp1-analytic"}), None)


def test_a_symbolic_link_out_of_the_traces_folder_is_refused(
        secret: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "azure_link.csv").symlink_to(secret)
    (traces / "azure_ok.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,10,5\n")
    monkeypatch.setenv("FLEETSIM_TRACES", str(traces))
    link = scenario(workload={"num_requests": 10, "trace": {"format": "azure", "path": "${traces}/azure_link.csv"}})
    with pytest.raises(ConfigError, match="leads outside them") as caught:
        runs.validate(link)
    assert SECRET not in str(caught.value)
    # The trace explorer reads names in the traces folders only.
    assert len(trace_files.load_trace_frame("azure_ok.csv")) == 1
    for name in ("azure_link.csv", str(secret), "../outside/azure_secret.csv", ".."):
        with pytest.raises(ConfigError) as refused:
            trace_files.load_trace_frame(name, "azure")
        assert SECRET not in str(refused.value), name


def test_whatif_page_refuses_an_upload_pointing_outside(secret: Path) -> None:
    """An uploaded scenario that names a file outside (kept in the session) is an error in the page, with
    Run disabled; the page never shows the file."""
    raw = outside_cases(secret)["absolute trace"]
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["wi_source"] = scenario_base.UPLOAD
    at.session_state["wi_uploaded_base"] = scenario_base.Base(key="upload:evil", raw=raw, source=None)
    at.run()
    assert not at.exception
    shown = [e.value for e in at.error]
    assert any("the dashboard reads only the public traces" in text for text in shown), shown
    assert at.button(key="wi_run").disabled
    page = " ".join(str(element.value) for kind in ("markdown", "caption", "error", "info", "code")
                    for element in at.get(kind) if hasattr(element, "value"))
    assert SECRET not in page and "root:" not in page


# ----- listening address -------------------------------------------------------------------------------


def non_loopback_ipv4() -> str | None:
    psutil = pytest.importorskip("psutil", reason="psutil lists this machine's addresses")
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def connects(host: str, port: int) -> bool:
    with socket.socket() as client:
        client.settimeout(2)
        try:
            client.connect((host, port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def dashboard_server(*extra: str):  # type: ignore[no-untyped-def]
    """``fleetsim dashboard --headless --port P`` as a user starts it; yields the port once it answers."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-m", "simulator.cli.main", "dashboard", "--headless", "--port",
                               str(port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 90
        while not connects("127.0.0.1", port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not start (exit {server.poll()})")
            time.sleep(0.2)
        yield port
    finally:
        server.terminate()  # the command stops the Streamlit server it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize(("extra", "reachable"), [((), False), (("--host", "0.0.0.0"), True)],
                         ids=["default", "told-every-interface"])
def test_dashboard_is_not_reachable_on_a_non_loopback_address_by_default(extra: tuple[str, ...],
                                                                        reachable: bool) -> None:
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    with dashboard_server(*extra) as port:
        assert connects("127.0.0.1", port)
        assert connects(address, port) is reachable, f"{address}:{port}"
