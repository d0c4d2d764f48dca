"""prometheus/relay-alerts.yml: the alerting rules relay ships.

Checked by Prometheus's own promtool where it is installed (Debian's
`prometheus` package; .ci/run installs it): the file parses (`promtool check
rules`) and the rules fire on the series relay exports (`promtool test
rules`). Without promtool, that every series a rule reads is one relay
exports from its start, at 0 — a rule on a series that does not exist yet
never fires, which is why they are initialised (relay.ops.metrics.configure).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest

from conftest import ConfigFactory, RelayFactory, SinkFactory

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "prometheus" / "relay-alerts.yml"
PROMTOOL = shutil.which("promtool")


def rule_expressions() -> dict[str, str]:
    """alert name -> expr (the file keeps each on one line)."""
    found: dict[str, str] = {}
    alert = ""
    for line in RULES.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"\s*- alert: (\w+)$", line):
            alert = match.group(1)
        elif match := re.match(r"\s*expr: (.+)$", line):
            found[alert] = match.group(1)
    return found


def test_the_rules_cover_what_needs_a_person() -> None:
    names = set(rule_expressions())
    for wanted in (
        "RelayDeadDeliveries",
        "RelayDeliveryKeepsFailing",
        "RelayRouteSilent",
        "RelayTargetDown",
        "RelayHeldDeliveries",
        "RelaySearchIndexBehind",
        "RelayDiskLow",
        "RelayRefusingWebhooks",
    ):
        assert wanted in names


async def test_every_series_a_rule_reads_is_exported_from_the_start(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    _, url = await start_sink([200])
    relay = await start_relay(
        make_config(
            {"crm": {"type": "http", "url": url}},
            {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        ),
        background=False,
    )
    async with aiohttp.ClientSession() as http, http.get(relay.admin_url + "/metrics") as got:
        exported = await got.text()
    series = {line.split("{")[0].split(" ")[0] for line in exported.splitlines() if line[:1] != "#"}
    for alert, expr in rule_expressions().items():
        for name in re.findall(r"\brelay_[a-z_]+", expr):
            assert name in series, f"{alert} reads {name}, which a fresh relay does not export"
        for name, label, value in re.findall(r"\b(relay_[a-z_]+)\{(\w+)=\"(\w+)\"\}", expr):
            assert re.search(rf"^{name}{{[^}}]*{label}=\"{value}\"", exported, re.M), (alert, expr)


# Input series as relay exports them; what must fire, and when. (A line break
# in a double-quoted YAML string is one space.)
PROMTOOL_TESTS = """
rule_files: [RULES]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'relay_deliveries{status="dead",target="crm"}'
        values: '0 0 1 1 1 1'
      - series: 'relay_deliveries_held{target="crm"}'
        values: '0 2x20'
      # The shop's route said silent at 2m, back at 6m.
      - series: 'relay_route_silent{route="shop"}'
        values: '0 0 1 1 1 1 0 0'
      # One lead keeps failing from 1m while the others go through.
      - series: 'relay_deliveries_failing{route="leads",target="crm"}'
        values: '0 1x20'
      - series: 'relay_events_received_total{result="unavailable",route="tilda"}'
        values: '0 0 0 3 3 3'
      - series: 'relay_storage_free_bytes'
        values: '5e9 5e8x15'
      # A refused reload at 1m, a good one at 4m: the alert follows the state
      # (it kept firing for 15 minutes after the good reload, on the counter).
      - series: 'relay_config_reload_failed'
        values: '0 1 1 1 0 0 0'
    alert_rule_test:
      - eval_time: 1m
        alertname: RelayDeadDeliveries
        exp_alerts: []
      - eval_time: 4m
        alertname: RelayDeadDeliveries
        exp_alerts:
          - exp_labels: {severity: warning, status: dead, target: crm}
            exp_annotations:
              summary: "1 dead deliveries to crm"
              description: "Retries are exhausted or the target refused them. sudo relay events
                --status dead --target crm; fix the cause, then sudo relay requeue
                --target crm"
      - eval_time: 5m
        alertname: RelayDeliveryKeepsFailing
        exp_alerts: []
      - eval_time: 7m
        alertname: RelayDeliveryKeepsFailing
        exp_alerts:
          - exp_labels: {severity: warning, route: leads, target: crm}
            exp_annotations:
              summary: "1 deliveries of route leads to crm keep failing"
              description: "sudo relay events --failing --route leads --target crm; relay show
                EVENT says why; correct it (relay resend EVENT --edit) or skip it."
      - eval_time: 2m
        alertname: RelayRouteSilent
        exp_alerts: []
      - eval_time: 3m
        alertname: RelayRouteSilent
        exp_alerts:
          - exp_labels: {severity: warning, route: shop}
            exp_annotations:
              summary: "route shop has received nothing for longer than usual"
              description: "Its sender may have stopped sending (WooCommerce disables a webhook
                after 5 failed deliveries; a republished Tilda form may post elsewhere). The
                Overview says since when; check the sender's webhook settings."
      - eval_time: 6m
        alertname: RelayRouteSilent
        exp_alerts: []
      - eval_time: 10m
        alertname: RelayHeldDeliveries
        exp_alerts: []
      - eval_time: 17m
        alertname: RelayHeldDeliveries
        exp_alerts:
          - exp_labels: {severity: warning, target: crm}
            exp_annotations:
              summary: "2 deliveries to crm held behind a dead one"
              description: "An ordering key (order_by) waits for a person: retry, requeue or skip
                the dead delivery. sudo relay events --status dead --target crm"
      - eval_time: 4m
        alertname: RelayRefusingWebhooks
        exp_alerts:
          - exp_labels: {severity: critical, result: unavailable, route: tilda}
            exp_annotations:
              summary: "relay answered 503 to senders of route tilda"
              description: "The database could not be written (disk full, locked, gone).
                journalctl -u relay; senders retry, but not for ever."
      - eval_time: 2m
        alertname: RelayReloadFailed
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: "a config reload was refused: the previous config runs"
              description: "journalctl -u relay | grep 'reload failed'; sudo relay check"
      - eval_time: 5m
        alertname: RelayReloadFailed
        exp_alerts: []
      - eval_time: 12m
        alertname: RelayDiskLow
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: "476.8MiB free beside relay's database"
              description: "A full disk turns every webhook into a 503. Free space, or lower
                storage.retention."
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_checks_the_rules_and_they_fire(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in checked.stdout
    tests = tmp_path / "relay-alerts.test.yml"
    tests.write_text(PROMTOOL_TESTS.replace("RULES", str(RULES)))
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
