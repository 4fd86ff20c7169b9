"""Settings precedence and the command line's answers to bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import ConfigError, load
from exporter.sim.scenario import ScenarioError, load_file, parse

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out


def test_precedence_flags_env_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("interval: 3\nlisten: 127.0.0.1:1\nengines: [http://a/metrics]\n")
    env = {"LLMGPU_INTERVAL": "2", "NODE_NAME": "node-7"}
    s = load({"interval": 0.5}, str(cfg), env)
    assert s.interval == 0.5 and s.listen == "127.0.0.1:1" and s.engines == ("http://a/metrics",)
    assert load({}, str(cfg), env).interval == 2
    assert load({}, str(cfg), {}).interval == 3
    assert load({}, None, env).node_name == "node-7"


@pytest.mark.parametrize(
    ("flags", "text", "env", "message"),
    [
        ({}, "interval: fast\n", {}, "'interval' must be a number, got 'fast'"),
        ({}, "discover_kubernetes: maybe\n", {}, "'discover_kubernetes' must be a boolean"),
        ({}, "colour: blue\n", {}, "unknown setting 'colour'"),
        ({}, "", {"LLMGPU_ENGINE_TIMEOUT": "-1"}, "'LLMGPU_ENGINE_TIMEOUT' must be from 0.1 to 300"),
        ({"listen": "9445"}, "", {}, "'listen' must be HOST:PORT"),
        ({}, "- a list\n", {}, "must be a mapping"),
    ],
)
def test_bad_settings_name_the_key(
    tmp_path: Path, flags: dict[str, object], text: str, env: dict[str, str], message: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(flags, str(cfg), env)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_no_driver_exits_3_with_a_hint() -> None:
    r = _cli("snapshot")
    assert r.returncode == 3
    assert "no NVIDIA driver" in r.stderr and "--simulate healthy" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unknown_scenario_exits_2_listing_known_ones() -> None:
    r = _cli("serve", "--simulate", "nope")
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr and "healthy" in r.stderr


def test_invalid_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("interval: [1]\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.returncode == 2 and "'interval' must be a number" in r.stderr


def test_snapshot_table_on_simulated_gpus() -> None:
    r = _cli("snapshot", "--simulate", "healthy", "--speed", "60")
    assert r.returncode == 0, r.stderr
    assert "8 GPU(s) (simulated)" in r.stdout and "NVIDIA H100 80GB HBM3" in r.stdout
    # the engine and the GPUs the join put it on
    assert "1 engine(s)" in r.stdout
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("127.0.0.1:")]
    assert "vllm" in row and "Llama-3.1-70B-Instruct" in row and "0,1,2,3,4,5,6,7" in row


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": {"count": 0}, "phases": [{"duration": 1}]}, "gpus.count"),
        ({"gpus": {"model": "Z9"}, "phases": [{"duration": 1}]}, "gpus.model"),
        ({"phases": []}, "phases"),
        ({"phases": [{"duration": 1, "gpu": {"warp_speed": 1}}]}, "known quantities"),
        ({"phases": [{"duration": 1, "gpu": {"util": "high"}}]}, "a number"),
        ({"phases": [{"duration": 1}], "faults": [{"kind": "melt"}]}, "faults\\[0\\].kind"),
        ({"phases": [{"duration": 1}], "faults": [{"kind": "hang"}]}, "function"),
        ({"phases": [{"duration": 1}], "extra": 1}, "unknown key 'extra'"),
    ],
)
def test_bad_scenarios_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(data)


def test_unreadable_scenario_file(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("phases: [")
    with pytest.raises(ScenarioError):
        load_file(tmp_path / "s.yaml")


def test_timeline_ramps_and_integrates() -> None:
    from exporter.sim.scenario import Timeline

    scn = parse(
        {
            "gpus": {"count": 1},
            "phases": [
                {"duration": 10, "gpu": {"pcie_tx_bps": 100}},
                {"duration": 10, "ramp": 10, "gpu": {"pcie_tx_bps": 300}},
            ],
        }
    )
    t = Timeline(scn)
    assert t.gpu(0, "pcie_tx_bps", 5) == 100
    assert t.gpu(0, "pcie_tx_bps", 15) == 200
    assert t.gpu(0, "pcie_tx_bps", 25) == 300  # holds after the end
    assert t.gpu_integral(0, "pcie_tx_bps", 20) == pytest.approx(1000 + 2000)
    assert t.gpu_integral(0, "pcie_tx_bps", 30) == pytest.approx(3000 + 3000)


# ---- one clear line and a distinct exit code for each way a command can fail -----------


def test_a_busy_port_is_one_line_and_exit_4() -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = _cli("serve", "--simulate", "healthy", "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 4, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"llm-gpu-exporter: 127.0.0.1:{port} is in use; choose another with --listen"
    ]
    assert "serving" not in r.stdout and "Traceback" not in r.stderr


def test_an_unknown_collector_is_one_line_and_exit_2() -> None:
    r = _cli("snapshot", "--simulate", "healthy", "--no-collector", "bogus")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "unknown collector(s) bogus" in line and "known:" in line


def test_abbreviated_flags_are_refused() -> None:
    r = _cli("serve", "--simulat", "healthy")
    assert r.returncode == 2 and "unrecognized arguments: --simulat" in r.stderr


def test_diagnose_tells_findings_from_a_missing_driver() -> None:
    assert _cli("diagnose").returncode == 3  # no NVIDIA driver here
    r = _cli("diagnose", "--simulate", "kv-pressure", "--step", "30")
    assert r.returncode == 1 and "memory/kv_cache_saturated" in r.stdout  # findings active
    assert _cli("diagnose", "--simulate", "healthy", "--step", "60").returncode == 0


def test_every_setting_is_a_flag_of_every_sampling_command() -> None:
    from exporter.cli import parser
    from exporter.config import Settings

    top = parser()
    commands = top._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in ("serve", "snapshot", "diagnose", "selfcheck"):
        dests = {a.dest for a in commands[command]._actions}
        assert set(Settings.model_fields) <= dests, (command, set(Settings.model_fields) - dests)
