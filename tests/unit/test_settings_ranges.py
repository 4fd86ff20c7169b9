"""Every setting has a range, checked at start: a hostile value is exit 2 and one line,
never a traceback in a running process; unknown LLMGPU_* variables are named, not fatal."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter import cli
from exporter.config import NUMBERS, Settings, bounds, flag_of, load, unknown_variables

HOSTILE = ["0", "-1", "nan", "inf", "1e308", "true", "", "9" * 5000]
# The same values as a YAML file types them.
HOSTILE_YAML = ["0", "-1", ".nan", ".inf", "1.0e+308", "true", '""', "x" * 5000]
ACCEPTED = 99  # what the patched command returns: the settings passed


def test_every_setting_declares_its_range() -> None:
    for name, f in Settings.model_fields.items():
        b = bounds(f)
        if name in NUMBERS:
            assert ("ge" in b or "gt" in b) and "le" in b, name
        elif f.annotation not in (bool,) and "Literal" not in str(f.annotation):
            assert "max_length" in b, name


def _run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]
) -> tuple[int, str]:
    monkeypatch.setattr(cli, "snapshot", lambda settings, as_json: ACCEPTED)
    for k in [k for k in os.environ if k.upper().startswith("LLMGPU_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = cli.main(["snapshot", *argv])
    return code, capsys.readouterr().err


CASES = [
    (name, source, i)
    for name in Settings.model_fields
    for source in ("flag", "env", "file")
    for i in range(len(HOSTILE))
    if not (source == "flag" and Settings.model_fields[name].annotation is bool)  # a flag without value
]


@pytest.mark.parametrize(("name", "source", "i"), CASES)
@pytest.mark.slow
def test_hostile_values_exit_2_with_one_line(
    name: str,
    source: str,
    i: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = HOSTILE[i]
    argv: list[str] = []
    env: dict[str, str] = {}
    if source == "flag":
        argv = [flag_of(name), value]
        named = flag_of(name)
    elif source == "env":
        env = {f"LLMGPU_{name.upper()}": value}
        named = f"LLMGPU_{name.upper()}"
    else:
        (tmp_path / "c.yaml").write_text(f"{name}: {HOSTILE_YAML[i]}\n")
        argv = ["--config", str(tmp_path / "c.yaml")]
        named = f"'{name}'"
    code, err = _run(monkeypatch, capsys, argv, env)
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and len(lines[0]) < 1000, err
        assert named in lines[0] or f"setting '{name}'" in lines[0], err
        return
    assert code == ACCEPTED, err
    # What passed is within the declared range; these never do.
    assert i != len(HOSTILE) - 1, "a 5000-character value passed"
    f = Settings.model_fields[name]
    if name in NUMBERS:
        assert value not in ("nan", "inf", "1e308", "true", "-1", ""), value
        b = bounds(f)
        x = float(value)
        assert math.isfinite(x) and b.get("ge", -math.inf) <= x <= b["le"] and x > b.get("gt", -math.inf)
    elif f.annotation is bool:
        assert value in ("0", "true")
    else:
        assert name != "listen" and "Literal" not in str(f.annotation)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine-interval", "0"], "'--engine-interval' must be from 0.1 to 3,600, got '0'"),
        (["--interval", "inf"], "'--interval' must be a finite number, got 'inf'"),
        (["--interval", "1e308"], "'--interval' must be from 0.05 to 300, got '1e308'"),
        (["--speed", "inf"], "'--speed' must be a finite number, got 'inf'"),
        (["--speed", "1e308"], "'--speed' must be above 0, at most 1,000, got '1e308'"),
    ],
)
def test_the_settings_that_left_a_half_dead_process(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(monkeypatch, capsys, ["--simulate", "healthy", *argv], {})
    assert code == 2 and err.strip() == f"llm-gpu-exporter: invalid configuration: {message}"


def test_a_boolean_is_not_an_integer(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("max_connections: true\n")
    with pytest.raises(ValueError, match="'max_connections' must be a number, not true or false, got True"):
        load({}, str(tmp_path / "c.yaml"), {})
    (tmp_path / "c.yaml").write_text("max_connections: 2\n")
    assert load({}, str(tmp_path / "c.yaml"), {}).max_connections == 2


def test_control_characters_and_long_values_are_refused_briefly() -> None:
    with pytest.raises(ValueError, match="must be text without control characters") as err:
        load({}, None, {"LLMGPU_PROBE_DIR": "/run/probes\x00/x"})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"must be 1 to 253 characters, got 'nnnn.*\(302 characters\)"):
        load({"node_name": "n" * 300}, None, {})


def _scenario_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "snapshot", "--scenario-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_a_binary_scenario_file_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"\x00\xff\xfe\x89PNG\r\n")
    r = _scenario_cli(path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"llm-gpu-exporter: {path}: not UTF-8 text (byte 1); not a scenario"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("phases: [{duration: .nan}]", "'phases[0].duration' must be a finite number"),
        ("phases: [{duration: 1.0e+308}]", "'phases[0].duration' must be a finite number of sane size"),
        ("phases: [{duration: 1.0e+12}]", "'phases.phase0.duration' must be seconds from 0.001 to 1e+07"),
        ("phases: [{duration: true}]", "'phases.phase0.duration' must be seconds"),
        ("phases: [{duration: 10, gpu: {util: .inf}}]", "'phases[0].gpu.util' must be a finite number"),
        (
            "phases: [{duration: 10, gpu: {util: 'nan'}}]",
            "'phases.phase0.gpu.util' must be a number from 0 to 1",
        ),
        (
            "phases: [{duration: 10, gpu: {util: 1.5}}]",
            "'phases.phase0.gpu.util' must be a number from 0 to 1",
        ),
        (
            "phases: [{duration: 10, engine: {itl_jitter: 1.0e+9}}]",
            "itl_jitter' must be a number from 1 to 1000",
        ),
        ("phases: [{duration: 10, ramp: -1}]", "'phases.phase0.ramp' must be seconds from 0"),
        ("gpus: {count: true}\nphases: [{duration: 1}]", "'gpus.count' must be an integer"),
        (
            "phases: [{duration: 1}]\nfaults: [{kind: hang, function: f, seconds: 1.0e+9}]",
            "'faults[0].seconds' must be seconds from 0 to 86400",
        ),
        ("phases: [{duration: 1}]\nfaults: [{kind: lost, at: 'nan'}]", "'faults[0].at/until' must be"),
        ("phases: [{duration: 1}]\nfaults: [{kind: xid, xid: 1.5}]", "'faults[0].xid' must be an XID"),
        (
            "phases: [{duration: 1}]\nengines: [{name: e, gpus: [0], block_size: .nan}]",
            "'engines[0].block_size' must be a finite number",
        ),
        ("phases: [{duration: 1}]\nengines: [{name: e, gpus: 3}]", "'engines.e.gpus' must be a list"),
        (
            "phases: [{duration: 1}]\nengines: [{name: e, gpu_memory_utilization: 'inf'}]",
            "'engines.e.gpu_memory_utilization' must be a number from 0.01 to 1",
        ),
        (
            "phases: [{duration: 1}]\ndcgm_exporter: {faults: [{kind: huge, bytes: 1.0e+15}]}",
            "bytes an integer from 0 to 1 GiB",
        ),
        ("phases: [{duration: 1}]\ndcgm_exporter: {interval: '.inf'}", "interval must be seconds"),
        (
            "gpus: {model: {name: X, memory_bytes: 1, power_limit_watts: 'nan', sm_clock_max_hertz: 1,\n"
            " memory_clock_max_hertz: 1, nvlinks: 0, gpm: false, pcie_generation: 4}}\n"
            "phases: [{duration: 1}]",
            "'gpus.model.power_limit_watts' must be a number",
        ),
        ("[" * 100_000, "nested too deeply"),
    ],
)
@pytest.mark.slow
def test_scenario_numbers_are_finite_and_in_range(tmp_path: Path, text: str, message: str) -> None:
    from exporter.sim.scenario import ScenarioError, load_file

    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=re.escape(message)) as err:
        load_file(path)
    assert "\n" not in str(err.value)


def test_a_fault_may_last_for_ever() -> None:
    from exporter.sim.scenario import parse

    scn = parse({"phases": [{"duration": 1}], "faults": [{"kind": "lost", "at": 1, "until": math.inf}]})
    assert scn.faults[0].until == math.inf


def test_unknown_variables_are_named_with_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        "LLMGPU_ENGINE_TIMOUT": "3",  # a typo
        "LLMGPU_PROBE_INTERVAL": "15",  # the allocator probe's, read in the engine's process
        "LLMGPU_CONFIG_DIR": "/etc",
        "LLMGPU_ZZZ": "1",  # near nothing
        "LLMGPU_INTERVAL": "2",
        "OTHER_THING": "1",
    }
    with caplog.at_level("WARNING", logger="exporter.config"):
        code, _ = _run(monkeypatch, capsys, ["--simulate", "healthy"], env)
    assert code == ACCEPTED  # an unknown variable stops nothing
    assert [r.getMessage() for r in caplog.records if r.name == "exporter.config"] == [
        "environment variable 'LLMGPU_CONFIG_DIR' is no setting and is ignored; did you mean LLMGPU_CONFIG?",
        "environment variable 'LLMGPU_ENGINE_TIMOUT' is no setting and is ignored; "
        "did you mean LLMGPU_ENGINE_TIMEOUT?",
        "environment variable 'LLMGPU_ZZZ' is no setting and is ignored",
    ]


def test_every_variable_the_package_reads_is_known() -> None:
    """A new LLMGPU_* name read anywhere in the package must be a setting or listed, or the
    exporter would warn about its own variable."""
    import re

    root = Path(cli.__file__).parent
    named = {m for p in root.rglob("*.py") for m in re.findall(r"LLMGPU_[A-Z][A-Z_]*[A-Z]", p.read_text())}
    env: dict[str, Any] = dict.fromkeys(named, "x")
    assert unknown_variables(env) == []
