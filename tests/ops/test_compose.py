"""docker-compose.yml read as Compose reads it (YAML merge keys included): every service's
command is one `swarm-api` accepts, every SWARM_* variable it sets is a setting, and the
services SPEC §17 names are there and start in order. Running it needs a container engine
(docs/OPERATIONS.md); what the images run is checked by tests/ops/test_image.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from app.simulator.config import SimulatorConfig
from tests.cli_parser import parse

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the `- KEY=value` spelling
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def swarm_services() -> dict[str, dict[str, Any]]:
    """The services that run this project's image."""
    return {name: s for name, s in services().items() if s.get("image") == "swarm-api:local"}


def test_the_services_of_spec_17() -> None:
    found = services()
    for name in ("postgres", "migrate", "api", "worker", "prometheus", "grafana", "jaeger"):
        assert name in found, name
    assert found["worker"]["deploy"]["replicas"] == 2
    for name in ("api", "worker"):
        assert found[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"}, name
    assert found["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert found["migrate"]["restart"] == "no"


def test_every_command_is_a_swarm_api_command(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = {name: s["command"] for name, s in swarm_services().items()}
    assert set(commands) >= {"migrate", "api", "worker"}
    for name, command in commands.items():
        assert isinstance(command, list) and command[0] == "swarm-api", (name, command)
        namespace = parse(command[1:], monkeypatch)
        assert namespace.command == command[1], name
    assert parse(commands["api"][1:], monkeypatch).no_engine  # the workers run the swarms
    assert commands["migrate"] == ["swarm-api", "migrate"]
    assert commands["worker"] == ["swarm-api", "worker"]


def test_a_command_the_cli_refuses_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        parse(["serve", "--engine-off"], monkeypatch)
    with pytest.raises(SystemExit):
        parse(["workers"], monkeypatch)


def test_every_swarm_variable_is_a_setting() -> None:
    settings = set(Settings.model_fields)
    simulator = {f.upper() for f in SimulatorConfig.__dataclass_fields__}
    seen = 0
    for name, service in swarm_services().items():
        for key in environment(service):
            if key.startswith("SWARM_SIM_"):  # the simulator's own (app/simulator/config.py)
                assert service["command"][1] == "simulator", (name, key)
                assert key.removeprefix("SWARM_SIM_") in simulator, (name, key)
            elif key.startswith("SWARM_"):
                assert key.removeprefix("SWARM_").lower() in settings, (name, key)
            seen += key.startswith("SWARM_")
    assert seen


def test_a_misspelt_variable_would_be_caught() -> None:
    assert "metrics_port" in Settings.model_fields
    assert "metric_port" not in Settings.model_fields


def test_prometheus_loads_the_alert_rules() -> None:
    prometheus = services()["prometheus"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prometheus["volumes"]}
    config_file = mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load((ROOT / config_file).read_text())
    for rules in config["rule_files"]:
        mounted = mounts[f"/etc/prometheus/{rules}"]  # rule paths are relative to the config
        assert (ROOT / mounted).is_file(), mounted
    assert "./deploy/prometheus/alerts.yml" in mounts.values()
