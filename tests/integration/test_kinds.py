"""A new kind of target or source is one module and one registration (relay.kinds).

This file is that module for two throwaway kinds. The target `notebook` keeps
each delivery's body in a list, under a label, and needs a credential; alerts
sent to it go under the label's own "-alerts" twin. The source `stamped`
accepts a request whose X-Stamp header carries its secret, names the event by
its X-Stamp-Id, and says its sender retries for two days.
Registered, each is read from a config, checked, shown masked, built and run
by a real relay, end to end, with nothing else in relay knowing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.cli.advice import warnings
from relay.cli.check import check_text
from relay.config import Answer, ConfigError, RouteConfig
from relay.config.reader import Section
from relay.core.clock import FakeClock
from relay.core.incoming import Incoming
from relay.core.outcome import Outcome
from relay.core.secrets import Masker, is_sensitive_header
from relay.kinds import AlertTemplates, SenderRetry, SourceKind, TargetKind
from relay.kinds.source import Accept, Check, Reject, Source
from relay.kinds.target import Envelope, Target
from relay.loader import load_database_command_config
from relay.loader.registry import (
    register_source,
    register_target,
    unregister_source,
    unregister_target,
)
from relay.ops.views import rejection_view, target_view
from relay.sources.base import matches_any
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import eventually, post_events, write_config

NOTEBOOKS: dict[str, list[bytes]] = {}


@dataclass(frozen=True)
class NotebookSettings:
    label: str
    key: str


def parse(section: Section, base: Path) -> NotebookSettings:
    label = section.string("label")
    key = section.string("key")
    if len(key) < 8:
        raise section.error("key", "a key of 8 characters or more", "(hidden)")
    return NotebookSettings(label=label, key=key)


class Notebook:
    def __init__(self, name: str, settings: NotebookSettings) -> None:
        self.name = name
        self._settings = settings

    async def start(self) -> None:
        NOTEBOOKS.setdefault(self._settings.label, [])

    async def close(self) -> None:
        pass

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return f"write in {self._settings.label}: {envelope.payload.body!r}"

    async def send(self, envelope: Envelope) -> Outcome:
        NOTEBOOKS[self._settings.label].append(envelope.payload.body)
        return Outcome.success()


def build(name: str, settings: NotebookSettings, concurrency: int) -> Target:
    return Notebook(name, settings)


def destination(settings: NotebookSettings, masker: Masker) -> str:
    return masker.text(f"notebook {settings.label} (key {settings.key})")


def view(settings: NotebookSettings, masker: Masker) -> dict[str, Any]:
    return {"label": settings.label, "key": masker.text(settings.key)}


def secrets(settings: NotebookSettings) -> Iterable[str]:
    return [settings.key]


def alert_twin(settings: NotebookSettings, alert: AlertTemplates) -> NotebookSettings:
    return replace(settings, label=f"{settings.label}-alerts")


NOTEBOOK = TargetKind(
    name="notebook",
    parse=parse,
    build=build,
    destination=destination,
    view=view,
    secrets=secrets,
    secret_keys=("key",),
    default_concurrency=2,
    alert_settings=alert_twin,
)


@pytest.fixture
def notebook_kind() -> Iterator[None]:
    register_target(NOTEBOOK)
    NOTEBOOKS.clear()
    yield
    unregister_target("notebook")


def notebook_config(make_config: ConfigFactory, **notebook: Any) -> Any:
    return make_config(
        {"book": {"type": "notebook", **notebook}},
        {"orders": {"path": "/hooks/orders", "targets": ["book"]}},
    )


async def test_a_registered_kind_is_read_shown_built_and_sent_to(
    notebook_kind: None,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
) -> None:
    config = notebook_config(make_config, label="orders", key="k-5551234-secret")
    target = config.targets["book"]
    assert (target.type, target.concurrency) == ("notebook", 2)
    assert "k-5551234-secret" in config.secrets

    text = check_text(config)
    assert "book (notebook notebook orders (key ***)" in text
    assert "k-5551234-secret" not in text
    shown = target_view(
        target, None, paused=False, counts={}, schedule="", masker=Masker(config.secrets)
    )
    assert (shown["type"], shown["label"], shown["key"]) == ("notebook", "orders", "***")

    relay = await start_relay(config, background=False)
    async with http.post(relay.ingress_url + "/hooks/orders", data=b'{"n": 1}') as answer:
        assert answer.status == 200
    await relay.scheduler.drain()
    assert NOTEBOOKS["orders"] == [b'{"n": 1}']
    (event,) = await relay.store.list_events(EventQuery())
    assert [d.status for d in event.deliveries] == [Status.DELIVERED]


async def test_alerts_to_it_go_through_the_twin_its_kind_declares(
    notebook_kind: None,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    _crm, crm_url = await start_sink([400])
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url},
            "book": {"type": "notebook", "label": "orders", "key": "k-5551234-secret"},
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        alerts={"target": "book"},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    await post_events(relay.ingress_url + "/hooks/orders", 1)
    await relay.scheduler.drain()
    assert await relay.alerter.flush() is not None  # crm's delivery went dead
    await relay.scheduler.drain()
    [alert] = NOTEBOOKS["orders-alerts"]
    assert json.loads(alert)["dead_count"] == 1
    assert NOTEBOOKS["orders"] == []


def test_its_settings_errors_name_the_key(notebook_kind: None, make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r"^targets\.book\.key: expected a key of 8"):
        notebook_config(make_config, label="orders", key="short")
    with pytest.raises(ConfigError, match=r"^targets\.book\.colour: unknown key"):
        notebook_config(make_config, label="orders", key="long-enough", colour="red")


def test_an_unregistered_kind_is_an_unknown_type(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r'targets\.book\.type: expected one of "http"'):
        notebook_config(make_config, label="orders", key="long-enough")


def test_the_operator_commands_mask_its_credential_keys(
    notebook_kind: None, tmp_path: Path
) -> None:
    # They read targets by name only, but a key written in the file is masked.
    path = write_config(
        tmp_path / "relay.toml",
        {
            "targets": {"book": {"type": "notebook", "label": "o", "key": "inline-key-123"}},
            "routes": {"orders": {"path": "/o", "targets": ["book"]}},
        },
    )
    assert "inline-key-123" in load_database_command_config(path, {}).secrets


@dataclass(frozen=True)
class StampedSettings:
    secret: str


class Stamped:
    answer: Answer | None = Answer(status=202, body=b"stamped", content_type="text/plain")

    def __init__(self, settings: StampedSettings) -> None:
        self._settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        if not matches_any(incoming.headers.get("X-Stamp"), [self._settings.secret]):
            return Reject("bad_stamp")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        return incoming.headers.get("X-Stamp-Id")


def parse_stamped(section: Section) -> StampedSettings:
    return StampedSettings(secret=section.string("stamp_secret"))


def build_stamped(settings: StampedSettings) -> Source:
    return Stamped(settings)


def stamped_secrets(settings: StampedSettings) -> Iterable[str]:
    return [settings.secret]


def stamped_advice(settings: StampedSettings, route: RouteConfig) -> list[str]:
    return [] if route.allow_ips else ["stamped senders should be allowed by address too"]


STAMPED = SourceKind(
    name="stamped",
    parse=parse_stamped,
    build=build_stamped,
    secrets=stamped_secrets,
    secret_keys=("stamp_secret",),
    secret_headers=("X-Stamp",),  # no "token" or "signature" in its name
    retry_window=SenderRetry("the stamping sender", 2 * 86400.0),
    dedup_window=40 * 86400.0,
    advice=stamped_advice,
)


@pytest.fixture
def stamped_kind() -> Iterator[None]:
    register_source(STAMPED)
    yield
    unregister_source("stamped")


async def test_a_registered_source_is_read_checked_and_answers_as_its_kind_says(
    stamped_kind: None,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
) -> None:
    config = make_config(
        {"audit": {"type": "file", "path": "audit.jsonl", "retry": {"retries": 2}}},
        {
            "stamps": {
                "path": "/hooks/stamps",
                "targets": ["audit"],
                "source": "stamped",
                "stamp_secret": "st-9f8e7d6c",
            }
        },
    )
    route = config.routes["stamps"]
    assert route.source_kind == "stamped"
    assert route.dedup_window == 40 * 86400.0  # raised to the kind's window
    assert "st-9f8e7d6c" in config.secrets
    found = warnings(config)
    assert "routes.stamps: stamped senders should be allowed by address too" in found
    assert any(
        "target audit gives up after" in w and "the stamping sender would have kept trying" in w
        for w in found
    )

    relay = await start_relay(config, background=False)
    url = relay.ingress_url + "/hooks/stamps"
    async with http.post(url, data=b"{}", headers={"X-Stamp": "wrong"}) as answer:
        assert answer.status == 401
    headers = {"X-Stamp": "st-9f8e7d6c", "X-Stamp-Id": "evt-1"}
    async with http.post(url, data=b"{}", headers=headers) as answer:
        assert (answer.status, await answer.read()) == (202, b"stamped")
    (event,) = await relay.store.list_events(EventQuery())
    assert event.idempotency_key == "evt-1"


async def test_its_secret_header_is_masked_even_when_its_value_is_no_secret_of_ours(
    stamped_kind: None,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
) -> None:
    """A wrong stamp (a near miss of the secret, a typo) is shown as *** in the
    rejections, because the kind says X-Stamp carries credentials."""
    config = make_config(
        {"audit": {"type": "file", "path": "audit.jsonl"}},
        {
            "stamps": {
                "path": "/hooks/stamps",
                "targets": ["audit"],
                "source": "stamped",
                "stamp_secret": "st-9f8e7d6c",
            }
        },
    )
    relay = await start_relay(config, background=False)
    near_miss = {"X-Stamp": "st-9f8e7d6X", "X-Other": "shown"}
    async with http.post(relay.ingress_url + "/hooks/stamps", data=b"{}", headers=near_miss) as r:
        assert r.status == 401

    async def recorded() -> bool:  # the ingress stores a rejection in the background
        return bool(await relay.store.list_rejections("stamps", 10))

    await eventually(recorded)
    (rejection,) = await relay.store.list_rejections("stamps", 10)
    headers = rejection_view(rejection, config.masker)["headers"]
    assert ["X-Stamp", "***"] in headers
    assert ["X-Other", "shown"] in headers
    unregister_source("stamped")
    try:
        assert not is_sensitive_header("X-Stamp")  # the kind's word, nobody else's
    finally:
        register_source(STAMPED)


def test_an_unregistered_source_is_an_unknown_one(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r'routes\.r\.source: expected one of "generic"'):
        make_config(
            {"audit": {"type": "file", "path": "audit.jsonl"}},
            {"r": {"path": "/r", "targets": ["audit"], "source": "stamped"}},
        )
