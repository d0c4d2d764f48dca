"""`relay init` and `relay backup`, as a user runs them."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpServer

from helpers import RELAY, RelayProcess, Sink, arelay_cli, relay_cli, write_config

STARTER_ENV = {
    "TILDA_API_KEY": "tilda-key",
    "BITRIX_WEBHOOK_URL": "https://example.bitrix24.ru/rest/1/abc123",
    "TELEGRAM_BOT_TOKEN": "123456:AAbot",
    "TELEGRAM_CHAT_ID": "-1001234567890",
    "SMTP_HOST": "smtp.example.com",
    "SMTP_USER": "relay@example.com",
    "SMTP_PASSWORD": "pw",
    "MAIL_FROM": "relay@example.com",
    "MAIL_TO": "manager@example.com",
}


def test_init_writes_a_config_that_checks_once_its_variables_are_set(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "relay.toml"
    assert "wrote" in relay_cli("init", str(path)).stdout
    unset = relay_cli("check", "--config", str(path), check=False)
    assert unset.returncode == 2
    assert "environment variable BITRIX_WEBHOOK_URL is not set" in unset.stderr
    checked = relay_cli("check", "--config", str(path), env=STARTER_ENV)
    assert "route tilda: POST /hooks/tilda" in checked.stdout
    assert "→ crm" in checked.stdout
    assert "→ sales_chat" in checked.stdout
    again = relay_cli("init", str(path), check=False)
    assert again.returncode == 2
    assert "exists" in again.stderr


def test_render_and_check_outside_the_unit_say_how_to_read_the_service_secrets(
    tmp_path: Path,
) -> None:
    """A new user on the VPS runs `relay render tilda --body lead.txt` (deploy.md
    step 5): the starter's secrets live in relay.env, which the shell has not
    loaded; the one-line error says which option reads it."""
    path = tmp_path / "relay.toml"
    relay_cli("init", str(path))
    (tmp_path / "lead.txt").write_text("Name=Anna&Phone=%2B79990000001&tranid=1:1")
    env = {k: v for k, v in STARTER_ENV.items() if k != "BITRIX_WEBHOOK_URL"}
    for command in (
        ["render", "tilda", "--body", str(tmp_path / "lead.txt")],
        ["check"],
    ):
        unset = relay_cli(*command, "--config", str(path), env=env, check=False)
        assert unset.returncode == 2
        assert unset.stderr.count("\n") == 1, unset.stderr
        assert "environment variable BITRIX_WEBHOOK_URL is not set" in unset.stderr
        assert "--env-file FILE, e.g. /etc/relay/relay.env" in unset.stderr
    env_file = tmp_path / "relay.env"
    env_file.write_text("BITRIX_WEBHOOK_URL=https://example.bitrix24.ru/rest/1/abc123\n")
    rendered = relay_cli(
        "render",
        "tilda",
        "--body",
        str(tmp_path / "lead.txt"),
        "--config",
        str(path),
        "--env-file",
        str(env_file),
        env=env,
    )
    assert "fields[NAME] = Anna" in rendered.stdout


async def test_backup_while_webhooks_arrive_holds_every_acknowledged_event(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    sink = Sink(script=[200])
    url = str((await aiohttp_server(sink.app())).make_url("/hook"))
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {"crm": {"type": "http", "url": url}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    acked: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def send(i: int) -> None:
                async with http.post(
                    f"{relay.url}/hooks/orders", json={"i": i}, headers={"Idempotency-Key": f"k{i}"}
                ) as response:
                    if response.status == 200:
                        acked.append(f"k{i}")

            first = asyncio.gather(*(send(i) for i in range(200)))
            await asyncio.sleep(0.05)
            backup = arelay_cli("backup", str(tmp_path / "during.db"), "--config", str(config))
            await asyncio.gather(first, backup)
            done_before = list(acked)
            await arelay_cli("backup", str(tmp_path / "after.db"), "--config", str(config))
    finally:
        await relay.astop()
    during = sqlite3.connect(tmp_path / "during.db")
    assert during.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    during.close()
    after = sqlite3.connect(tmp_path / "after.db")
    keys = {row[0] for row in after.execute("SELECT idempotency_key FROM events")}
    after.close()
    assert set(done_before) <= keys
    assert len(acked) == 200


def test_init_writes_a_readable_config_that_names_its_database(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "relay" / "relay.toml"
    # As `sudo` may run it on a hardened machine: a umask that keeps everything private.
    written = subprocess.run(
        [*RELAY, "init", str(path), "--database", "/var/lib/relay/relay.db"],
        preexec_fn=lambda: os.umask(0o077),
        capture_output=True,
        text=True,
        check=True,
    )
    for folder in (tmp_path / "etc", tmp_path / "etc" / "relay"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert "mode 644" in written.stdout
    # The service's dynamic user is not root and owns nothing here: it reads
    # the file because everyone may, which is why it holds no secret.
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert 'path = "/var/lib/relay/relay.db"' in path.read_text()
    assert "default: ./relay.toml" in relay_cli("init", "--help").stdout


def test_commands_refuse_a_config_whose_database_does_not_exist(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": "elsewhere/relay.db"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
        },
    )
    for command in (["events"], ["show", "1"], ["stats"], ["rejections"], ["retry", "1"]):
        result = relay_cli(*command, "--config", str(config), check=False)
        assert result.returncode == 2, command
        assert result.stderr == (
            f"relay: no database at {tmp_path / 'elsewhere' / 'relay.db'}"
            " (is this the service's config?)\n"
        )
    assert not (tmp_path / "elsewhere").exists()  # nothing created on the way


def test_check_reads_the_env_file_as_systemd_and_the_credential_files(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "admin": {"listen": "127.0.0.1:0", "token": "${file:relay_admin_token}"},
            "targets": {
                "chat": {
                    "type": "telegram",
                    "bot_token": "${BOT_TOKEN}",
                    "chat_id": "${CHAT_ID}",
                }
            },
            "routes": {"leads": {"path": "/hooks/leads", "targets": ["chat"]}},
        },
    )
    credentials = tmp_path / "elsewhere" / "credentials"  # not beside the config
    credentials.mkdir(parents=True)
    (credentials / "relay_admin_token").write_text("0123456789abcdef0123456789abcdef\n")
    env_file = tmp_path / "elsewhere" / "relay.env"
    # What systemd gives the service: the comment is part of the value.
    env_file.write_text("# the bot\nBOT_TOKEN=123:AAsecret\nCHAT_ID=-100123 # sales chat\n")

    outside = relay_cli("check", "--config", str(config), "--env-file", str(env_file), check=False)
    assert outside.returncode == 2
    assert "--credentials DIR" in outside.stderr
    assert "Traceback" not in outside.stderr

    checked = relay_cli(
        "check",
        "--config",
        str(config),
        "--env-file",
        str(env_file),
        "--credentials",
        str(credentials),
    )
    assert "config OK" in checked.stdout
    assert "123:AAsecret" not in checked.stdout
    # The comment is in the value: as systemd would pass it, and said so.
    assert "CHAT_ID's value has a comment after it, which systemd keeps" in checked.stdout
    assert "BOT_TOKEN's value" not in checked.stdout


def test_backup_is_private(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
        },
    )
    sqlite3.connect(tmp_path / "relay.db").close()  # an empty database: relay migrates it
    relay_cli("purge", "--config", str(config))
    made = relay_cli("backup", str(tmp_path / "copy.db"), "--config", str(config))
    assert "mode 600" in made.stdout
    assert stat.S_IMODE((tmp_path / "copy.db").stat().st_mode) == 0o600


def test_check_warns_of_a_secret_written_into_a_world_readable_config(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "admin": {"listen": "127.0.0.1:0", "token": "0123456789abcdef0123456789"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {
                "tilda": {
                    "path": "/hooks/tilda",
                    "source": "tilda",
                    "api_key": "${TILDA_API_KEY}",
                    "targets": ["audit"],
                }
            },
        },
    )
    env = {"TILDA_API_KEY": "tilda-key-1"}
    config.chmod(0o644)
    readable = relay_cli("check", "--config", str(config), env=env).stdout
    assert "warning: admin.token: a secret written in" in readable
    assert "routes.tilda.api_key" not in readable  # a reference is no secret in the file
    assert "0123456789abcdef0123456789" not in readable
    config.chmod(0o600)
    private = relay_cli("check", "--config", str(config), env=env).stdout
    assert "a secret written in" not in private


def _service_layout(tmp_path: Path) -> Path:
    """deploy.md's /etc/relay: relay.toml, relay.env and credentials/ side by side."""
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "admin": {"listen": "127.0.0.1:0", "token": "${file:relay_admin_token}"},
            "targets": {
                "chat": {"type": "telegram", "bot_token": "${BOT_TOKEN}", "chat_id": "-100123"}
            },
            "routes": {"leads": {"path": "/hooks/leads", "targets": ["chat"]}},
        },
    )
    (tmp_path / "credentials").mkdir(mode=0o700)
    (tmp_path / "credentials" / "relay_admin_token").write_text("0123456789abcdef0123456789ab\n")
    (tmp_path / "relay.env").write_text("BOT_TOKEN=123:AAsecret\n")
    return config


def test_check_reads_the_services_env_file_and_credentials_beside_the_config(
    tmp_path: Path,
) -> None:
    """One way to run database commands against the service's config: `sudo
    relay check` with no flag (it failed: "credential relay_admin_token needs
    $CREDENTIALS_DIRECTORY", and operate.md's `sh -c 'set -a; . relay.env'`
    could not give it one)."""
    config = _service_layout(tmp_path)
    checked = relay_cli("check", "--config", str(config))
    assert "config OK" in checked.stdout
    assert f"secrets read from: {tmp_path / 'relay.env'}, {tmp_path / 'credentials'}" in (
        checked.stdout
    )
    assert "123:AAsecret" not in checked.stdout
    (tmp_path / "lead.json").write_text('{"name": "Anna"}')
    rendered = relay_cli(
        "render", "leads", "--body", str(tmp_path / "lead.json"), "--config", str(config)
    )
    assert "=== chat (telegram)" in rendered.stdout


def test_check_warns_of_a_config_the_services_user_cannot_read(tmp_path: Path) -> None:
    config = _service_layout(tmp_path)
    os.chown(config, 0, 0)
    config.chmod(0o600)
    checked = relay_cli("check", "--config", str(config))
    assert "config OK" in checked.stdout  # root reads it fine...
    assert (  # ...the service's dynamic user would not
        f"warning: {config} is mode 600, owned by root: the service's user cannot read it"
        f" and relay will not start; it holds no secret: sudo chmod 644 {config}"
    ) in checked.stdout
    config.chmod(0o644)
    assert "cannot read it" not in relay_cli("check", "--config", str(config)).stdout


async def test_check_says_when_the_running_service_has_older_secrets(tmp_path: Path) -> None:
    """systemd reads relay.env only at start: a chat_id changed there and then
    `systemctl reload` kept the old chat. relay check says a restart is due."""
    config = _service_layout(tmp_path)
    # systemd's environment; the admin token it finds beside the config itself.
    relay = RelayProcess(config, tmp_path / "relay.log", env={"BOT_TOKEN": "123:AAsecret"})
    relay.start()
    try:
        quiet = await arelay_cli("check", "--config", str(config))
        assert "changed after the running relay serve" not in quiet.stdout
        started = (tmp_path / "relay.db.lock").stat().st_mtime
        os.utime(tmp_path / "relay.env", (started + 5, started + 5))
        told = await arelay_cli("check", "--config", str(config))
        assert (
            f"warning: {tmp_path / 'relay.env'} changed after the running relay serve"
            f" (PID {relay.process.pid}) started" in told.stdout
        ), told.stdout
        assert "sudo systemctl restart relay" in told.stdout
    finally:
        assert await relay.astop() == 0
    stopped = await arelay_cli("check", "--config", str(config))
    assert "changed after the running relay serve" not in stopped.stdout
