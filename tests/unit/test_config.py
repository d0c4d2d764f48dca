"""The config loader: the issue's exact file, every error naming its key, ${VAR}."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from relay.cli.check import check_text, durability_warnings
from relay.config import ConfigError
from relay.loader import load_config, load_database_command_config, parse_config
from relay.targets.file import FileSettings
from relay.targets.http import HttpSettings

from helpers import RELAY

ROOT = Path(__file__).resolve().parents[2]

ISSUE_CONFIG = """
[server]
listen = "127.0.0.1:8080"        # public ingress
max_body_size = "1MiB"

[storage]
path = "relay.db"                # SQLite, WAL
synchronous = "full"

[retry]
backoff = "exponential"
base = 2
unit = "1s"
retries = 15
jitter = 0.1
# max_delay = "6h"
# delays = ["30s", "2m", "10m", "1h", "6h", "24h"]
timeout = "10s"

[targets.crm]
type = "http"
url = "https://crm.example/api/leads"

[targets.crm.retry]
delays = ["30s", "2m", "10m", "1h", "6h", "24h"]

[targets.audit]
type = "file"
path = "deliveries.jsonl"

[routes.orders]
path = "/hooks/orders"
targets = ["crm", "audit"]
"""


def parse(data: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return parse_config(data, environ or {}, base=Path("/srv/relay"))


def test_the_issue_config_loads_with_paths_relative_to_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "relay.toml"
    path.parent.mkdir()
    path.write_text(ISSUE_CONFIG)
    config = load_config(path, {})
    assert config.server.listen.port == 8080
    assert config.server.max_body_size == 1 << 20
    assert config.storage.path == path.parent / "relay.db"
    assert config.storage.synchronous == "full"
    assert isinstance(config.targets["audit"].settings, FileSettings)
    assert config.targets["audit"].settings.path == path.parent / "deliveries.jsonl"
    crm = config.targets["crm"]
    assert isinstance(crm.settings, HttpSettings)
    assert crm.retry.backoff == "list"
    assert crm.retry.delays == (30, 120, 600, 3600, 21600, 86400)
    assert crm.retry.retries == 6
    assert crm.retry.timeout == 10  # inherited from [retry]
    assert config.targets["audit"].retry.retries == 15
    assert [t.target for t in config.routes["orders"].targets] == ["crm", "audit"]


def test_check_prints_each_schedule(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(ISSUE_CONFIG)
    text = check_text(load_config(path, {}))
    assert "route orders: POST /hooks/orders" in text
    assert "15 retries, 2s … 9h06m, cycle 18h12m" in text
    assert "6 retries, 30s … 1d00h, cycle 1d07h" in text
    assert "delays: 30s 2m00s 10m00s 1h00m 6h00m 1d00h" in text


def test_example_config_runs_as_is() -> None:
    config = load_config(ROOT / "relay.example.toml", {})
    assert config.server.listen.is_loopback
    assert config.storage.path == ROOT / "relay.db"
    assert any(isinstance(t.settings, FileSettings) for t in config.targets.values())


BASE: dict[str, Any] = {
    "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/x"}},
    "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
}


def merged(**sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {key: dict(value) for key, value in BASE.items()}
    for name, value in sections.items():
        if name in data:
            for key, inner in value.items():
                data[name][key] = {**data[name].get(key, {}), **inner}
        else:
            data[name] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (merged(server={"lisen": "x"}), "server.lisen: unknown key (expected one of: listen,"),
        (merged(server={"listen": "8080"}), 'server.listen: expected an address like "127.0.0.1'),
        (merged(server={"max_body_size": "lots"}), "server.max_body_size: expected a size like"),
        (merged(storage={"synchronous": "off"}), 'storage.synchronous: expected one of "full",'),
        (merged(retry={"unit": "soon"}), 'retry.unit: expected a duration like "500ms"'),
        (
            merged(retry={"retries": -1}),
            "retry.retries: expected an integer from 0 to 1000, got -1",
        ),
        (merged(retry={"jitter": 2}), "retry.jitter: expected a number from 0 to 1, got 2"),
        (merged(retry={"delays": ["30s", "never"]}), "retry.delays[1]: expected a duration"),
        (merged(retry={"backoff": "list"}), 'retry.delays: is required with backoff = "list"'),
        (merged(targets={"crm": {"type": "ftp"}}), 'targets.crm.type: expected one of "http",'),
        (merged(targets={"crm": {"url": "crm.example"}}), "targets.crm.url: expected an http://"),
        (merged(targets={"crm": {"retry": {"base": "two"}}}), "targets.crm.retry.base: expected a"),
        (
            merged(targets={"crm": {"concurrency": 0}}),
            "targets.crm.concurrency: expected an integer",
        ),
        (
            merged(targets={"crm": {"headers": {"A": 1}}}),
            "targets.crm.headers.A: expected a string",
        ),
        # RFC 9110 sections 5.1 and 5.5: a name is a token, and no value holds
        # CR, LF or NUL; every delivery with such a header would be dead.
        (
            merged(targets={"crm": {"headers": {"X-Id": "a\u0000b"}}}),
            "targets.crm.headers.X-Id: holds a line break or NUL",
        ),
        (
            merged(targets={"crm": {"headers": {"X-Id": "a\r\nX-Evil: 1"}}}),
            "targets.crm.headers.X-Id: holds a line break or NUL",
        ),
        (
            merged(targets={"crm": {"headers": {"X Id": "1"}}}),
            "targets.crm.headers.X Id: is not a header name",
        ),
        (
            merged(targets={"crm": {"headers": {"X-Id:": "1"}}}),
            "targets.crm.headers.X-Id:: is not a header name",
        ),
        (merged(targets={"crm": {"colour": "red"}}), "targets.crm.colour: unknown key"),
        (
            merged(routes={"orders": {"path": "hooks"}}),
            "routes.orders.path: expected a path starting",
        ),
        (
            merged(routes={"orders": {"targets": ["crn"]}}),
            'routes.orders.targets[0]: unknown target "crn"',
        ),
        (merged(routes={"orders": {"targets": []}}), "routes.orders.targets: expected a non-empty"),
        (
            merged(routes={"orders": {"idempotency_key": "{{ json. }}"}}),
            "routes.orders.idempotency_key: template syntax error",
        ),
        (
            merged(routes={"orders": {"targets": [{"target": "crm", "retry": {"retries": "x"}}]}}),
            "routes.orders.targets[0].retry.retries: expected an integer",
        ),
        (
            merged(routes={"orders": {"require_idempotency_key": "yes"}}),
            "routes.orders.require_idempotency_key: expected true or false",
        ),
        (
            merged(routes={"other": {"path": "/hooks/orders", "targets": ["crm"]}}),
            'routes.other.path: "/hooks/orders" is already the path of routes.orders',
        ),
        (merged(logs={"level": "debug"}), "logs: unknown key"),
        (
            merged(storage={"url": "mysql://relay@db/relay"}),
            'storage.url: expected a URL like "postgresql://relay@db/relay"',
        ),
        (
            merged(storage={"url": "postgresql://relay@db/relay", "dead_after": "1s"}),
            "storage.dead_after: expected 2s or more",
        ),
        (
            merged(storage={"url": "postgresql://relay@db/relay", "instance_id": "vps 1"}),
            "storage.instance_id: expected up to 100 letters, digits and . _ - : @",
        ),
        (
            merged(storage={"dead_after": "30s"}),
            "storage.dead_after: applies to PostgreSQL only (set storage.url)",
        ),
        (
            merged(storage={"instance_id": "vps1"}),
            "storage.instance_id: applies to PostgreSQL only (set storage.url)",
        ),
        (  # a host no lookup can find: every delivery would wait out its retries
            merged(targets={"crm": {"url": "https://crm .example/hook"}}),
            "targets.crm.url: expected an http:// or https:// URL",
        ),
        (
            merged(targets={"crm": {"url": "https://crm%20.example/hook"}}),
            "targets.crm.url: expected an http:// or https:// URL",
        ),
        (
            merged(admin={"timezone": "Europe/Moskow"}),
            "admin.timezone: unknown time zone 'Europe/Moskow' (did you mean Europe/Moscow?)",
        ),
    ],
)
def test_errors_name_the_key_and_what_is_expected(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_cluster_instance_takes_its_name_and_dead_after() -> None:
    url = "postgresql://relay@db/relay"
    storage = parse(
        merged(storage={"url": url, "instance_id": "vps-1", "dead_after": "3s"})
    ).storage
    assert (storage.instance_id, storage.dead_after) == ("vps-1", 3.0)
    defaults = parse(merged(storage={"url": url})).storage
    assert (defaults.instance_id, defaults.dead_after) == (None, 10.0)


def test_a_command_needs_none_of_the_hosts_own_variables(tmp_path: Path) -> None:
    # docs/postgres.md: one relay.toml on every host, each host's name and
    # listeners from its own environment; `relay resend` and `render` in a
    # shell need neither (they do not listen, and lease nothing).
    path = tmp_path / "relay.toml"
    path.write_text(
        '[server]\nlisten = "${RELAY_LISTEN}"\n'
        '[admin]\nlisten = "${RELAY_ADMIN_LISTEN}"\n'
        '[storage]\nurl = "postgresql://relay@db/relay"\ninstance_id = "${RELAY_INSTANCE}"\n'
        '[targets.crm]\ntype = "file"\npath = "crm.jsonl"\n'
        '[routes.leads]\npath = "/hooks/leads"\ntargets = ["crm"]\n'
    )
    config = load_config(path, {}, command=True)
    assert config.storage.instance_id is None
    assert list(config.targets) == ["crm"]
    with pytest.raises(ConfigError) as raised:
        load_config(path, {})  # relay serve and check need them all
    assert "RELAY_LISTEN" in str(raised.value)


def test_environment_references_are_substituted_and_remembered_as_secrets() -> None:
    data = merged(targets={"crm": {"headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}})
    config = parse(data, {"CRM_TOKEN": "s3cret-token"})
    settings = config.targets["crm"].settings
    assert isinstance(settings, HttpSettings)
    assert settings.headers["Authorization"].source == "Bearer s3cret-token"
    assert "s3cret-token" in config.secrets


def test_an_error_about_a_value_never_shows_what_a_reference_put_in_it() -> None:
    # A mistyped scheme in a URL that carries a token from the environment: the
    # one-line error goes to the journal, and must name the key, not the token.
    data = merged(targets={"crm": {"url": "htp://crm.example/hook/${CRM_TOKEN}"}})
    with pytest.raises(ConfigError) as raised:
        parse(data, {"CRM_TOKEN": "s3cret-token"})
    message = str(raised.value)
    assert message.startswith("targets.crm.url: expected an http:// or https:// URL")
    assert "s3cret-token" not in message
    assert "htp://crm.example/hook/***" in message


def test_a_commands_error_about_the_storage_url_never_shows_its_password(
    tmp_path: Path,
) -> None:
    # Database commands read only [storage] (relay.loader.database_commands): the same rule.
    path = tmp_path / "relay.toml"
    path.write_text('[storage]\nurl = "mysql://relay:${PGPASSWORD}@db/relay"\n')
    with pytest.raises(ConfigError) as raised:
        load_database_command_config(path, {"PGPASSWORD": "s3cret-password"})
    assert str(raised.value).startswith("storage.url: expected a URL like")
    assert "s3cret-password" not in str(raised.value)


def test_a_storage_url_of_another_database_is_shown_without_its_password() -> None:
    # Written into the file itself (against the guide's advice): still not repeated.
    with pytest.raises(ConfigError) as raised:
        parse(merged(storage={"url": "mysql://relay:literal-pw@db/relay"}))
    assert str(raised.value).endswith("got 'mysql://relay:***@db/relay'")


def test_an_unset_variable_names_the_key_and_the_variable() -> None:
    data = merged(targets={"crm": {"headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}})
    with pytest.raises(
        ConfigError,
        match=r"targets\.crm\.headers\.Authorization: environment "
        r"variable CRM_TOKEN is not set",
    ):
        parse(data)


def test_dollar_escape_and_credentials(tmp_path: Path) -> None:
    (tmp_path / "crm_token").write_text("from-credential\n")
    data = merged(targets={"crm": {"headers": {"A": "$${x}", "B": "${file:crm_token}"}}})
    settings = parse(data, {"CREDENTIALS_DIRECTORY": str(tmp_path)}).targets["crm"].settings
    assert {k: v.source for k, v in settings.headers.items()} == {
        "A": "${x}",
        "B": "from-credential",
    }


def test_route_target_overrides_start_from_the_target_schedule() -> None:
    data = merged(
        targets={"crm": {"retry": {"delays": ["30s", "2m"]}}},
        routes={"orders": {"targets": [{"target": "crm", "retry": {"retries": 4}}]}},
    )
    policy = parse(data).routes["orders"].targets[0].retry
    assert policy.delays == (30, 120)
    assert policy.retries == 4


def test_check_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text('[server]\nlisen = "127.0.0.1:8080"\n')
    result = subprocess.run(
        [*RELAY, "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "server.lisen: unknown key" in result.stderr


# Issue 15: a template naming what its place does not offer used to pass
# `relay check` and then fail at run time, each time: a `when` reading `event`
# made every delivery dead ("'event' is undefined"), an `idempotency_key` reading
# it silently gave no key (de-duplication off), and `jsn.id` failed every send.
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            merged(
                routes={"orders": {"targets": [{"target": "crm", "when": "event.route == 'x'"}]}}
            ),
            "routes.orders.targets[0].when: reads event, which is not known here",
        ),
        (
            merged(routes={"orders": {"idempotency_key": "{{ event.id }}"}}),
            "routes.orders.idempotency_key: reads event, which is not known here",
        ),
        (
            merged(
                routes={"orders": {"targets": [{"target": "crm", "order_by": "{{ event.id }}"}]}}
            ),
            "routes.orders.targets[0].order_by: reads event, which is not known here",
        ),
        (
            merged(routes={"orders": {"idempotency_key": "{{ jsn.id }}"}}),
            "routes.orders.idempotency_key: reads jsn, which is not a template variable"
            " (use body, form, headers, json, query)",
        ),
        (
            merged(targets={"crm": {"format": "json", "body": '{"id": {{ jsn.id }}}'}}),
            "targets.crm.body: reads jsn, which is not a template variable"
            " (use body, event, form, headers, json, query)",
        ),
        (
            merged(targets={"crm": {"headers": {"X-Order": "{{ evnt.id }}"}}}),
            "targets.crm.headers.X-Order: reads evnt, which is not a template variable",
        ),
    ],
)
def test_a_template_may_read_only_what_its_place_offers(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_templates_read_what_they_are_offered_and_jinja_names() -> None:
    config = parse(
        merged(
            targets={
                "crm": {
                    "format": "json",
                    "body": '{"id": "{{ event.id }}", "n": [{% for i in range(2) %}{{ i }},'
                    "{% endfor %}0]}",
                    "headers": {"X-Route": "{{ event.route }} {{ headers['X-A'] | default('') }}"},
                }
            },
            routes={
                "orders": {
                    "idempotency_key": "{{ json.id }}{{ form.id }}{{ query.id }}{{ body[:1] }}",
                    "targets": [
                        {"target": "crm", "when": "json.ok and headers['X-A'] != 'no'"},
                    ],
                }
            },
        )
    )
    assert config.routes["orders"].targets[0].when is not None


def test_check_warns_of_sqlite_settings_left_beside_a_postgresql_url(tmp_path: Path) -> None:
    # A SQLite install moved to PostgreSQL: the guide says "set [storage] url",
    # and the old keys stay behind doing nothing. relay check says so.
    from relay.cli.advice import warnings

    path = tmp_path / "relay.toml"
    path.write_text(
        '[storage]\nurl = "postgresql://relay@db/relay"\npath = "relay.db"\n'
        'synchronous = "full"\n\n[admin]\nenabled = false\n'
        '[targets.crm]\ntype = "file"\npath = "out.jsonl"\n'
        '[routes.orders]\npath = "/hooks/orders"\ntargets = ["crm"]\ntoken = "${T}"\n'
    )
    found = warnings(load_config(path, {"T": "a-route-token"}))
    assert [w for w in found if w.startswith("storage.")] == [
        "storage.path: not used with storage.url (PostgreSQL holds the data): remove it",
        "storage.synchronous: not used with storage.url (PostgreSQL holds the data): remove it",
    ]
    path.write_text(path.read_text().replace('path = "relay.db"\nsynchronous = "full"\n', ""))
    assert not [w for w in warnings(load_config(path, {"T": "x"})) if w.startswith("storage.")]


def test_check_warns_of_a_postgresql_server_that_could_lose_acknowledged_events() -> None:
    assert durability_warnings({"fsync": "on", "synchronous_commit": "on"}) == []
    assert durability_warnings({"fsync": "on", "synchronous_commit": "local"}) == []
    [fsync] = durability_warnings({"fsync": "off", "synchronous_commit": "on"})
    assert fsync.startswith("the PostgreSQL server runs with fsync = off: a power cut")
    both = durability_warnings({"fsync": "off", "synchronous_commit": "off"})
    assert [w.split(":")[0] for w in both] == [
        "the PostgreSQL server runs with fsync = off",
        "the PostgreSQL server runs with synchronous_commit = off",
    ]
