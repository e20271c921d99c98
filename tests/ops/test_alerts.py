"""deploy/prometheus/alerts.yml (SPEC §17): Prometheus' own rule tests pass (`promtool test
rules`, a firing and a quiet case per alert), the shipped configuration loads the rules
(`promtool check config`), and every series the rules read is one the service exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app import metrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
# what the issue asks the rules to watch, by the series that shows it
WATCHED = {
    "gateway error ratio": "swarm_gateway_requests_total",
    "spend rate against the daily cap": "swarm_daily_budget_usd",
    "unresolved spend": "swarm_spend_unresolved_usd_total",
    "oldest queued swarm": "swarm_queue_oldest_age_seconds",
    "lease takeovers": "swarm_takeovers_total",
    "quota denials": "swarm_quota_denials_total",
    "readiness": "up",
    "creation p99": "swarm_http_request_duration_seconds_bucket",
}


def promtool() -> str:
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool is missing: apt-get install -y prometheus (.ci/run installs it)",
                    pytrace=False)
    return found


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def test_promtool_rule_tests_pass() -> None:
    run = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_broken_rule_fails_its_tests(tmp_path: Path) -> None:
    """The tests pin each alert: one threshold changed, promtool fails."""
    text = (PROMETHEUS / "alerts.yml").read_text()
    assert "max(swarm_queue_oldest_age_seconds) > 300" in text
    (tmp_path / "alerts.yml").write_text(
        text.replace("max(swarm_queue_oldest_age_seconds) > 300",
                     "max(swarm_queue_oldest_age_seconds) > 3000"))
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path)
    run = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "SwarmQueueStuck" in run.stdout + run.stderr


def test_the_shipped_configuration_loads_the_rules() -> None:
    run = subprocess.run([promtool(), "check", "config", "prometheus.yml"], cwd=PROMETHEUS,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert f"SUCCESS: {len(rules())} rules found" in run.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {r["alert"] for r in rules()}
    assert names == fired == quiet, (names - fired, names - quiet)
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_rules_watch_what_the_issue_names_with_series_the_service_exposes() -> None:
    metrics.set_daily_budget(Decimal("100"))  # absent without a cap
    try:
        body, _ = metrics.render()
    finally:
        metrics.set_daily_budget(None)
    exposed = {"up"}  # Prometheus' own, per target
    for family in text_string_to_metric_families(body.decode()):
        # a histogram's series appear with their first label set (an HTTP route's on its
        # first request): its names are known from the family all the same
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        exposed |= {family.name + s for s in suffixes.get(family.type, ("",))}
    used = {m for r in rules()
            for m in re.findall(r"\b(swarm_[a-z_]+|up)\b(?=\s*[{\[)]|\s*[!=<>])", r["expr"])}
    for what, series in WATCHED.items():
        assert series in used, what
    assert used <= exposed, used - exposed
