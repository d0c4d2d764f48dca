"""Hostile input, generated: arbitrary requests against a running relay, arbitrary
configs against the loader, arbitrary bodies against the parsers and the
source verifiers. Never a 500, never a crash, never an event stored for a
refused request.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import string
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from docs.kitchen_sink import SOURCE_OPTIONS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.config import ConfigError
from relay.config.reader import Section
from relay.core.incoming import Incoming
from relay.core.payload import Payload, parse_form, parse_json
from relay.kinds.source import Accept, Ping, Reject
from relay.loader import parse_config
from relay.loader.registry import source_kinds

from figures import record_figures
from helpers import RelayProcess, write_config

# Thousands of examples each: bounded by their count, not by the default
# per-test timeout (which a loaded machine turned into a hypothesis "flaky
# strategy" report in the middle of the config fuzzing).
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def record_fuzz_figures() -> Iterator[None]:
    """How many inputs each fuzz test tried, written when this module's tests are
    done, in whatever order they ran (was a last test named test_zz_...)."""
    yield
    record_figures(
        "fuzz",
        {
            "config_inputs": TRIED["config"],
            "parser_inputs": TRIED["parsers"],
            "verifier_inputs": TRIED["verifiers"],
        },
    )


ANY = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much]

token = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=30)
header_value = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300)
content_types = st.sampled_from(
    [
        "application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "multipart/form-data; boundary=xyz",
        "text/plain",
        "application/octet-stream",
        "",
        "application/json; charset=utf-8",
        "multipart/form-data; boundary=",
        "x/\u00ff",
    ]
)
bodies = st.one_of(
    st.binary(max_size=3000),
    st.text(max_size=2000).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.dictionaries(
        token,
        st.one_of(
            st.text(max_size=50),
            st.integers(-(2**63), 2**63 - 1),  # what JSON encoders take
            st.booleans(),
            st.none(),
            st.lists(st.integers(0, 1000), max_size=3),
        ),
        max_size=10,
    ).map(orjson.dumps),
    st.lists(st.tuples(token, st.text(max_size=30)), max_size=10).map(
        lambda pairs: "&".join(f"{k}={v}" for k, v in pairs).encode("utf-8", "surrogatepass")
    ),
    st.builds(
        lambda b, parts: (
            f"--{b}\r\n"
            + "".join(
                f'Content-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n--{b}\r\n'
                for n, v in parts
            )
            + "--"
        ).encode("utf-8", "surrogatepass"),
        token,
        st.lists(st.tuples(token, st.text(max_size=20)), max_size=5),
    ),
)

ROUTES: dict[str, Any] = {
    "open": {"path": "/hooks/open", "targets": ["audit"]},
    "keyed": {
        "path": "/hooks/keyed",
        "targets": ["audit"],
        "require_idempotency_key": True,
        "idempotency_key": "{{ json.id }}",
    },
    "tilda": {
        "path": "/hooks/tilda",
        "targets": ["audit"],
        "source": "tilda",
        "api_key": "k-secret",
    },
    "tbank": {"path": "/hooks/tbank", "targets": ["audit"], "source": "tbank", "password": "p"},
    "std": {
        "path": "/hooks/std",
        "targets": ["audit"],
        "source": "standard-webhooks",
        "secret": "whsec_c2VjcmV0",
    },
    "when": {"path": "/hooks/when", "targets": [{"target": "audit", "when": "json.a.b == form.c"}]},
}


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    folder = tmp_path_factory.mktemp("fuzz")
    config = write_config(
        folder / "relay.toml",
        {
            "server": {"max_body_size": "2KiB"},
            "targets": {"audit": {"type": "file", "path": "audit.jsonl"}},
            "routes": ROUTES,
        },
    )
    process = RelayProcess(config, folder / "relay.log").start()
    yield process
    process.stop()


def test_ingress_never_fails_and_stores_only_what_it_accepts(relay: RelayProcess) -> None:
    address = urlsplit(relay.url)
    queued: set[str] = set()
    statuses: Counter[int] = Counter()

    @settings(max_examples=1500, deadline=None, suppress_health_check=ANY, database=None)
    @given(
        method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
        path=st.one_of(
            st.sampled_from([route["path"] for route in ROUTES.values()]),
            st.text(alphabet=string.ascii_letters + string.digits + "/%._-~", max_size=80).map(
                lambda p: "/" + p
            ),
        ),
        query=st.text(alphabet=string.ascii_letters + "=&%+", max_size=40),
        headers=st.dictionaries(token, header_value, max_size=15),
        content_type=content_types,
        body=bodies,
    )
    def case(
        method: str, path: str, query: str, headers: dict[str, str], content_type: str, body: bytes
    ) -> None:
        TRIED["ingress"] += 1
        clean = {
            k: v
            for k, v in headers.items()
            if k.lower()
            not in (
                "content-length",
                "transfer-encoding",
                "host",
                "connection",
                "expect",
                "upgrade",
            )
        }
        if content_type:
            clean["Content-Type"] = content_type
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
        try:
            connection.request(
                method, path + ("?" + query if query else ""), body=body, headers=clean
            )
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        statuses[response.status] += 1
        # 2xx/4xx only: no 500 (a bug), no 503 (the disk is fine here).
        assert response.status < 500, (response.status, answer[:200])
        if response.status == 200 and answer.startswith(b'{"status":"queued"'):
            queued.add(json.loads(answer)["id"])

    case()
    relay.stop()
    database = sqlite3.connect(relay.config_path.parent / "relay.db")
    stored = {str(row[0]) for row in database.execute("SELECT id FROM events")}
    database.close()
    record_figures(
        "fuzz_ingress",
        {"requests": TRIED["ingress"], "statuses": dict(statuses), "stored": len(stored)},
    )
    assert stored == queued
    assert "Traceback" not in relay.log()


json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
known_keys = st.sampled_from(
    [
        "listen",
        "max_body_size",
        "path",
        "synchronous",
        "retries",
        "delays",
        "unit",
        "base",
        "jitter",
        "type",
        "url",
        "targets",
        "source",
        "when",
        "target",
        "headers",
        "format",
        "body",
        "form",
        "rate",
        "concurrency",
        "token",
        "secret",
        "idempotency_key",
        "response",
        "bot_token",
        "chat_id",
        "host",
        "to",
        "from",
        "allow_ips",
        "retry",
        "timeout",
    ]
)


def config_trees() -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.one_of(
        json_values,
        st.sampled_from(
            ["1s", "1MiB", "http://x/", "a", "{{ json.x }}", "127.0.0.1:0", "${UNSET}", "{% for %}"]
        ),
    )
    table = st.dictionaries(st.one_of(known_keys, st.text(max_size=8)), leaf, max_size=8)
    return st.fixed_dictionaries(
        {},
        optional={
            "server": table,
            "storage": table,
            "retry": table,
            "admin": table,
            "targets": st.dictionaries(token, table, max_size=3),
            "routes": st.dictionaries(token, table, max_size=3),
            "alerts": table,
            "log": table,
        },
    )


@settings(max_examples=2000, deadline=None, suppress_health_check=ANY, database=None)
@given(tree=config_trees())
def test_the_config_loader_answers_every_input_with_a_config_or_one_error(
    tree: dict[str, Any],
) -> None:
    TRIED["config"] += 1
    try:
        parse_config(tree, {}, base=Path("/tmp"))
    except ConfigError as error:
        message = str(error)
    else:
        return
    assert "\n" not in message


@settings(max_examples=5000, deadline=None, suppress_health_check=ANY, database=None)
@given(content_type=content_types, body=bodies)
def test_body_parsers_never_raise(content_type: str, body: bytes) -> None:
    TRIED["parsers"] += 1
    parse_form(content_type, body)
    parse_json(body)


def _sources() -> list[Any]:
    built = []
    for kind in source_kinds():
        options = {"source": kind, **SOURCE_OPTIONS.get(kind, {})}
        if kind in ("generic",):
            options["token"] = "t"
        if kind == "tilda":
            options["api_key"] = "k"
        source = source_kinds()[kind]
        built.append(source.build(source.parse(Section(options, "routes.r"))))
    return built


SOURCE_OBJECTS = _sources()


@settings(max_examples=3000, deadline=None, suppress_health_check=ANY, database=None)
@given(
    index=st.integers(min_value=0, max_value=len(SOURCE_OBJECTS) - 1),
    headers=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "X-WC-Webhook-Signature",
                    "webhook-id",
                    "webhook-timestamp",
                    "webhook-signature",
                    "X-Telegram-Bot-Api-Secret-Token",
                    "X-Tilda-Api-Key",
                    "X-Sig",
                    "X-Relay-Token",
                    "Content-Type",
                ]
            )
            | token,
            header_value,
        ),
        max_size=8,
    ),
    body=bodies,
    query=st.text(max_size=30),
)
def test_source_verifiers_never_raise(
    index: int, headers: list[tuple[str, str]], body: bytes, query: str
) -> None:
    TRIED["verifiers"] += 1
    incoming = Incoming(Payload.received("POST", "/x", query, headers, body))
    result = SOURCE_OBJECTS[index].check(incoming, 1_800_000_000.0)
    assert isinstance(result, Accept | Ping | Reject)
