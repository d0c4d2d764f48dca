"""`relay render`: what each target would send for a sample form, nothing sent or stored."""

from __future__ import annotations

from pathlib import Path

from helpers import relay_cli, write_config

ENV = {
    "BOT_TOKEN": "123456:AAsecret-bot",
    "CRM_TOKEN": "crm-secret-token-1",
    "SMTP_PW": "mail-pw-99",
}


def test_render_shows_each_target_and_masks_secrets(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {
                "crm": {
                    "type": "http",
                    "url": "https://b24.example/rest/1/${CRM_TOKEN}/crm.lead.add",
                    "format": "form",
                    "form": {
                        "fields[TITLE]": "Lead {{ form.name }}",
                        "fields[PHONE][0][VALUE]": "{{ form.phone }}",
                    },
                    "headers": {"Authorization": "Bearer ${CRM_TOKEN}"},
                },
                "sales": {
                    "type": "telegram",
                    "bot_token": "${BOT_TOKEN}",
                    "chat_id": "-100500",
                    "text": "Lead: {{ form.name }} ({{ form.phone }})",
                },
                "manager": {
                    "type": "smtp",
                    "host": "mail.example",
                    "username": "relay",
                    "password": "${SMTP_PW}",
                    "from": "relay@shop.example",
                    "to": ["boss@shop.example"],
                    "subject": "Заявка: {{ form.name }}",
                    "text": "Телефон: {{ form.phone }}",
                },
                "vip": {"type": "http", "url": "https://vip.example/hook"},
                # A CRM's JSON made with Jinja's tojson, which writes Cyrillic as
                # \u escapes (json.dumps' ensure_ascii): valid, and unreadable.
                "amo": {
                    "type": "http",
                    "url": "https://amo.example/api/v4/leads",
                    "format": "json",
                    "body": '[{"name": {{ form.name | tojson }}, "price": 0}]',
                    "sign": "whsec_c2lnbmluZy1zZWNyZXQtZm9yLXRlc3Rz",
                },
            },
            "routes": {
                "lead": {
                    "path": "/hooks/lead",
                    "idempotency_key": "{{ form.tranid }}",
                    "targets": [
                        "crm",
                        "sales",
                        "manager",
                        "amo",
                        {"target": "vip", "when": "form.vip == 'yes'"},
                    ],
                }
            },
        },
    )
    body = tmp_path / "form.txt"
    body.write_text("name=%D0%90%D0%BD%D0%BD%D0%B0&phone=%2B7999&tranid=42:1&vip=no")
    result = relay_cli("render", "lead", "--body", str(body), "--config", str(config), env=ENV)
    out = result.stdout
    assert "idempotency key: 42:1" in out
    assert "POST https://b24.example/rest/1/***/crm.lead.add" in out
    # As a person reads it: form fields decoded, the mail's subject and text
    # as a mail program shows them, the chat message's text.
    assert "  fields[TITLE] = Lead Анна\n  fields[PHONE][0][VALUE] = +7999\n" in out
    assert "fields%5B" not in out
    assert "Authorization: ***" in out
    assert "POST https://api.telegram.org/bot***/sendMessage: to chat -100500" in out
    assert "\nLead: Анна (+7999)\n" in out
    assert "Subject: Заявка: Анна\n" in out
    assert "\nТелефон: +7999" in out
    assert "=?utf-8?" not in out
    assert "=== vip (http)\nskipped: when: form.vip == 'yes' is false" in out
    # JSON as text (it showed "\u0410\u043d\u043d\u0430"), and the event id a
    # preview cannot know said as such, not "0".
    assert '\n[\n  {\n    "name": "Анна",\n    "price": 0\n  }\n]' in out
    assert "\\u0410" not in out
    assert "X-Relay-Event-Id: (the event's id once stored)" in out
    assert "X-Relay-Event-Id: 0" not in out
    # The signed target's webhook-id, made from the delivery's id once stored.
    assert "webhook-id: (the delivery's own, once stored)" in out
    assert "msg_relay_0" not in out
    for secret in ENV.values():
        assert secret not in out
    assert not (tmp_path / "relay.db").exists()  # nothing stored

    # --wire: the exact bytes, encoded as they go out.
    wire = relay_cli(
        "render", "lead", "--body", str(body), "--config", str(config), "--wire", env=ENV
    ).stdout
    assert "fields%5BTITLE%5D=Lead+%D0%90%D0%BD%D0%BD%D0%B0&fields%5BPHONE%5D%5B0%5D" in wire
    assert "Subject: =?utf-8?" in wire
    assert "Заявка" not in wire
    assert '"text": "Lead: Анна (+7999)"' in wire
    assert '[{"name": "Анна", "price": 0}]' in wire  # UTF-8 JSON, letters as letters
    for secret in ENV.values():
        assert secret not in wire


def test_render_reports_a_failing_template(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {
                "crm": {
                    "type": "http",
                    "url": "https://crm.example/x",
                    "format": "json",
                    "body": '{"email": {{ json.email | tojson }}}',
                }
            },
            "routes": {"lead": {"path": "/hooks/lead", "targets": ["crm"]}},
        },
    )
    body = tmp_path / "b.json"
    body.write_text('{"name": "no email here"}')
    result = relay_cli("render", "lead", "--body", str(body), "--config", str(config), check=False)
    assert result.returncode == 1
    assert "would be dead: template error" in result.stdout
    assert "email" in result.stdout
