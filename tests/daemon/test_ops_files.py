"""The Grafana dashboard and the Prometheus alert rules shipped in docker/: every metric they use is one a
real scrape of the daemon's collector exports (not a list written here), every rule says how long, how bad
and what to do, the dashboard names no datasource of anyone's own; and, where Debian's `prometheus`
package put `promtool` on the PATH, the rules pass `promtool check rules` and fire as their unit tests say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.test_http import exported_samples

DOCKER = Path(__file__).resolve().parents[2] / "docker"
RULES = DOCKER / "autotuner-daemon-alerts.yaml"
DASHBOARD = DOCKER / "grafana-autotuner-daemon.json"
JOB = "autotuner-daemon"
OURS = re.compile(r"\bautotuner_[A-Za-z0-9_:]+")
REQUIRED = {"ProductionDown", "DaemonNotPolling", "DaemonDown", "CycleFailed", "EmergencyMitigation", "DowntimeBudget"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return set(exported_samples(tmp_path_factory.mktemp("scrape")))


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs(node: Any) -> Iterator[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                yield value
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


def datasources(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasources(item)


def test_every_rule_uses_exported_metrics_and_says_how_long_how_bad_and_what(exported: set[str]) -> None:
    found = rules()
    assert {r["alert"] for r in found} >= REQUIRED
    for rule in found:
        where = rule["alert"]
        assert isinstance(rule.get("for"), str) and re.fullmatch(r"\d+[smhd]", rule["for"]), where
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), where
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip(), where
        names = OURS.findall(rule["expr"])
        unknown = sorted(set(names) - exported)
        assert not unknown, f"{where} uses {unknown}, which the collector does not export"
        if not names:  # the one rule about the scrape itself
            assert f'up{{job="{JOB}"}}' in rule["expr"], where


def test_the_dashboard_shows_every_exported_metric_and_hard_codes_no_datasource(exported: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = list(dashboard_exprs(dash))
    used = {name for e in exprs for name in OURS.findall(e)}
    assert used and not used - exported, f"not exported: {sorted(used - exported)}"
    families = {name.removesuffix("_total") for name in exported}
    shown = {name.removesuffix("_total") for name in used}
    assert families <= shown, f"exported but on no panel: {sorted(families - shown)}"
    # A datasource is the template variable, never one Grafana's UID.
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for ds in datasources(dash):
        uid = ds.get("uid") if isinstance(ds, dict) else ds
        assert uid in ("${datasource}", "$datasource"), ds
    assert "__inputs" not in dash
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


PROMTOOL_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  # A healthy daemon over a production that goes down after a minute.
  - interval: 1m
    input_series:
      - series: 'autotuner_daemon_production_up{{job="{job}",instance="box:8765"}}'
        values: '1 0 0 0 0 0'
      - series: 'up{{job="{job}",instance="box:8765"}}'
        values: '1 1 1 1 1 1'
      - series: 'autotuner_daemon_last_poll_success_timestamp_seconds{{job="{job}",instance="box:8765"}}'
        values: '0+60x5'
      - series: 'autotuner_daemon_last_cycle_outcome{{job="{job}",instance="box:8765",outcome="failed"}}'
        values: '0 0 0 0 0 0'
    alert_rule_test:
      - {{eval_time: 2m, alertname: ProductionDown, exp_alerts: []}}
      - eval_time: 4m
        alertname: ProductionDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: {job}, instance: "box:8765"}}
      - {{eval_time: 5m, alertname: DaemonNotPolling, exp_alerts: []}}
      - {{eval_time: 5m, alertname: DaemonDown, exp_alerts: []}}
      - {{eval_time: 5m, alertname: CycleFailed, exp_alerts: []}}
  # A daemon whose loop stopped polling, then a daemon not scraped at all.
  - interval: 1m
    input_series:
      - series: 'autotuner_daemon_last_poll_success_timestamp_seconds{{job="{job}",instance="box:8765"}}'
        values: '0x10'
      - series: 'autotuner_daemon_last_cycle_outcome{{job="{job}",instance="box:8765",outcome="failed"}}'
        values: '1x10'
      - series: 'autotuner_daemon_emergency_mitigations_total{{job="{job}",instance="box:8765"}}'
        values: '0 0 1 1 1 1 1 1 1 1 1'
    alert_rule_test:
      - {{eval_time: 5m, alertname: DaemonNotPolling, exp_alerts: []}}
      - eval_time: 8m
        alertname: DaemonNotPolling
        exp_alerts: [{{exp_labels: {{severity: critical, job: {job}, instance: "box:8765"}}}}]
      - eval_time: 3m
        alertname: DaemonDown
        exp_alerts: [{{exp_labels: {{severity: critical, job: {job}}}}}]
      - eval_time: 2m
        alertname: CycleFailed
        exp_alerts: [{{exp_labels: {{severity: critical, job: {job}, instance: "box:8765", outcome: failed}}}}]
      - eval_time: 3m
        alertname: EmergencyMitigation
        exp_alerts: [{{exp_labels: {{severity: warning, job: {job}, instance: "box:8765"}}}}]
  # 60 s of downtime a minute: past the 15-minute budget.
  - interval: 1m
    input_series:
      - series: 'autotuner_daemon_downtime_seconds_total{{job="{job}",instance="box:8765"}}'
        values: '0+60x40'
    alert_rule_test:
      - {{eval_time: 10m, alertname: DowntimeBudget, exp_alerts: []}}
      - eval_time: 30m
        alertname: DowntimeBudget
        exp_alerts: [{{exp_labels: {{severity: warning, job: {job}, instance: "box:8765"}}}}]
"""


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not on PATH (Debian: apt-get install prometheus)")
def test_promtool_checks_the_rules_and_they_fire_when_they_should(tmp_path: Path) -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # The unit tests are about when each rule fires (expr, for, labels): they run on a copy without the
    # annotations, whose templates `check rules` has parsed, so that rewording one breaks no test.
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    firing = tmp_path / "rules.yaml"
    firing.write_text(yaml.safe_dump(doc))
    tests = tmp_path / "alerts_test.yaml"
    tests.write_text(PROMTOOL_TESTS.format(rules=json.dumps(str(firing)), job=JOB))
    run = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
