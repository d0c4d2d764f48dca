"""The config examples in docs/deploy.md work with the starter config.

The Tilda and T-Bank blocks are added to what `relay init` writes, as the
guide tells a reader to; the result must check, and T-Bank's documented
notification (tests/fixtures/tbank) must become a complete message for its
own target, not a blank lead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from helpers import admin_credentials, relay_cli, to_toml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
ENV = {
    "TILDA_API_KEY": "tilda-key-1",
    "BITRIX_WEBHOOK_URL": "https://example.bitrix24.ru/rest/1/abc123",
    "TELEGRAM_BOT_TOKEN": "123456:AAbot",
    "TELEGRAM_CHAT_ID": "-1001234567890",
    "SMTP_HOST": "smtp.example.com",
    "SMTP_USER": "relay@example.com",
    "SMTP_PASSWORD": "smtp-pw-1",
    "MAIL_FROM": "relay@example.com",
    "MAIL_TO": "manager@example.com",
    "TBANK_PASSWORD": "tbank-pw-1",
}


def guide_toml(route: str) -> dict[str, Any]:
    guide = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```toml\n(.*?)^```", guide, re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if f"[routes.{route}]" in b]
    return tomllib.loads(block)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def test_the_tilda_and_tbank_examples_check_and_tbank_has_a_message_of_its_own(
    tmp_path: Path,
) -> None:
    starter = tomllib.loads(resources.files("relay").joinpath("starter.toml").read_text())
    config = merged(merged(starter, guide_toml("tilda")), guide_toml("tbank"))
    path = tmp_path / "relay.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    admin_credentials(tmp_path / "credentials")  # beside the config, as relay init leaves it
    checked = relay_cli("check", "--config", str(path), env=ENV)
    assert "route tbank" in checked.stdout
    # The guide's own example passes its own check: a reader is not left with
    # warnings and no value that would quiet them.
    assert "warning" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr

    notification = FIXTURES / "tbank" / "notification-confirmed.json"
    shown = relay_cli(
        "render", "tbank", "--body", str(notification), "--config", str(path), env=ENV
    ).stdout
    assert "=== payments_chat (telegram)" in shown
    assert "Payment confirmed</b>: order 201709, 192.00 RUB" in shown
    assert "Payment 8742591, card 430000******0777" in shown
    assert "fell back to a default" not in shown
    assert "crm" not in shown.split("===", 1)[1]  # a payment is not a lead

    refunded = FIXTURES / "tbank" / "notification-partial-refund-1.json"
    skipped = relay_cli(
        "render", "tbank", "--body", str(refunded), "--config", str(path), env=ENV
    ).stdout
    assert "skipped: when: json.Status == 'CONFIRMED' is false" in skipped


DEBIAN_PROMETHEUS = Path("/etc/prometheus/prometheus.yml")


@pytest.mark.skipif(
    shutil.which("promtool") is None or not DEBIAN_PROMETHEUS.exists(),
    reason="Debian's prometheus package (promtool and its prometheus.yml) not installed",
)
def test_the_prometheus_lines_fit_debians_own_file(tmp_path: Path) -> None:
    # The guide's snippet, appended as it was written, repeated rule_files and
    # scrape_configs: Debian's file then does not load. Done as the guide now
    # says (a line under rule_files:, the job at the end of scrape_configs:),
    # Prometheus's own checker reads it, rules and relay's job included.
    guide = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    [block] = [
        b for b in re.findall(r"```yaml\n(.*?)```", guide, re.DOTALL) if "job_name: relay" in b
    ]
    lines = [line[2:] if line.startswith("  ") else line for line in block.splitlines()]
    rule = next(line for line in lines if "rules/*.yml" in line).split("#")[0].rstrip()
    job = "\n".join(lines[lines.index("  - job_name: relay") :]) + "\n"
    original = DEBIAN_PROMETHEUS.read_text()
    assert "\nrule_files:" in original
    edited = original.replace("\nrule_files:\n", f"\nrule_files:\n{rule}\n", 1)
    edited = edited.rstrip("\n") + "\n" + job
    config = tmp_path / "prometheus.yml"
    config.write_text(edited)
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "prometheus" / "relay-alerts.yml", rules / "relay-alerts.yml")
    checked = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "relay-alerts.yml" in checked.stdout
    doubled = original + '\nrule_files: ["rules/*.yml"]\n'  # what appending the old snippet did
    config.write_text(doubled)
    refused = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0
