"""No admin listener without a token by default: `admin.token_file` (what the
example config uses) gets a random token at the first start, and `relay init`
hands out a fresh one for the starter config."""

from __future__ import annotations

import stat
from pathlib import Path

import aiohttp
import pytest

from relay.config import ConfigError
from relay.loader import load_config
from relay.loader.load import MIN_TOKEN_BITS, token_bits

from helpers import RelayProcess, relay_cli, write_config


def config_with_token_file(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "admin": {"listen": "127.0.0.1:0", "token_file": "secret/admin.token"},
            "storage": {"path": "relay.db"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": {"demo": {"path": "/hooks/demo", "targets": ["audit"]}},
        },
    )


async def test_a_token_file_is_written_at_first_start_and_then_required(tmp_path: Path) -> None:
    path = config_with_token_file(tmp_path)
    token_path = tmp_path / "secret" / "admin.token"
    checked = relay_cli("check", "--config", str(path))
    assert "config OK" in checked.stdout
    assert not token_path.exists()  # checking a config writes nothing
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    try:
        token = token_path.read_text().strip()
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert token_bits(token) >= 2 * MIN_TOKEN_BITS
        async with aiohttp.ClientSession() as http:
            stats = relay.admin_url + "/api/v1/stats"
            async with http.get(stats) as response:
                assert response.status == 401
            async with http.get(stats, headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200
    finally:
        assert await relay.astop() == 0
    log = relay.log()
    assert str(token_path) in log
    assert token not in log
    # The next start uses the same token: the operator's bookmark keeps working.
    again = RelayProcess(path, tmp_path / "relay.log").start()
    assert again.stop() == 0
    assert token_path.read_text().strip() == token
    assert load_config(path, {}).admin.token == token


def test_token_and_token_file_together_are_refused(tmp_path: Path) -> None:
    path = config_with_token_file(tmp_path)
    path.write_text(
        path.read_text().replace('token_file = "secret/admin.token"', "")
        + '\n[admin]\ntoken = "kq3V9_Xw-2bLr7TzN4pYc"\ntoken_file = "admin.token"\n'
    )
    with pytest.raises(ConfigError, match="admin"):
        load_config(path, {})


def test_a_weak_token_in_the_file_is_refused_naming_the_file_key(tmp_path: Path) -> None:
    path = config_with_token_file(tmp_path)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "admin.token").write_text("a" * 40 + "\n")
    with pytest.raises(ConfigError, match=r"^admin\.token_file: too easy to guess"):
        load_config(path, {})


def test_init_writes_one_fresh_strong_token_where_the_config_reads_it(tmp_path: Path) -> None:
    """One token, one place: the credential file the starter reads
    (`${file:relay_admin_token}`) and deploy.md hands over with LoadCredential=.
    It was printed as RELAY_ADMIN_TOKEN=…, and deploy.md drew a second one."""
    tokens = []
    for name in ("one", "two"):
        output = relay_cli("init", str(tmp_path / name / "relay.toml")).stdout
        token_path = tmp_path / name / "credentials" / "relay_admin_token"
        assert f"admin token in {token_path}" in output, output
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
        token = token_path.read_text().strip()
        assert token not in output  # shown by `sudo cat`, not in a terminal's scrollback
        tokens.append(token)
        # relay check finds it beside the config, as the unit would hand it over.
        config = load_config(tmp_path / name / "relay.toml", _starter_env(token_path.parent))
        assert config.admin.token == token
    assert tokens[0] != tokens[1]
    assert all(token_bits(token) >= 2 * MIN_TOKEN_BITS for token in tokens)
    assert all(token not in (tmp_path / "one" / "relay.toml").read_text() for token in tokens)
    # init --force rewrites the config, not the password people sign in with.
    relay_cli("init", "--force", str(tmp_path / "one" / "relay.toml"))
    assert (tmp_path / "one/credentials/relay_admin_token").read_text().strip() == tokens[0]


def _starter_env(credentials: Path) -> dict[str, str]:
    names = ["TILDA_API_KEY", "BITRIX_WEBHOOK_URL", "TELEGRAM_BOT_TOKEN", "TELEGRAM_CHAT_ID"]
    names += ["SMTP_HOST", "SMTP_USER", "SMTP_PASSWORD", "MAIL_FROM", "MAIL_TO"]
    env = {name: "x" for name in names}
    env["BITRIX_WEBHOOK_URL"] = "https://example.bitrix24.ru/rest/1/abc"
    env["TELEGRAM_BOT_TOKEN"] = "123456:AAbot"
    env["MAIL_FROM"] = env["MAIL_TO"] = env["SMTP_USER"] = "relay@example.com"
    return {**env, "CREDENTIALS_DIRECTORY": str(credentials)}
