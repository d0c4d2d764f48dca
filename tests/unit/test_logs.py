"""The attempt log line, in both formats, masked."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from relay.config import LogConfig
from relay.core.outcome import Outcome
from relay.core.payload import Payload
from relay.core.secrets import Masker
from relay.delivery.scheduler import AttemptReport
from relay.ops import logs
from relay.store import AttemptKind, ClaimedDelivery, Dead, FailureStreak, RetryAt


def report(error: str) -> AttemptReport:
    delivery = ClaimedDelivery(
        id=31,
        event_id=12,
        route="orders",
        target="crm",
        attempts=1,
        attempts_in_cycle=1,
        manual=False,
        resume_status=None,
        resume_at=None,
        idempotency_key="k",
        received_at=0.0,
        payload=Payload(
            method="POST",
            path="/",
            query="",
            headers=[],
            content_type=None,
            body=b"",
        ),
    )
    return AttemptReport(
        delivery=delivery,
        number=2,
        kind=AttemptKind.CYCLE,
        cycle_step=2,
        cycle_length=7,
        outcome=Outcome.retry(error, 503),
        then=RetryAt(120.0),
        duration=0.0124,
        streak=FailureStreak(1, 2),
    )


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    yield stream
    logging.getLogger().handlers.clear()


@pytest.mark.parametrize("form", ["text", "json"])
def test_attempt_lines_carry_every_field_and_no_secret(form: str, captured: io.StringIO) -> None:
    logs.configure(LogConfig(format=form), Masker(["s3cret-value"]))  # type: ignore[arg-type]
    logging.getLogger().handlers[0].setStream(captured)  # type: ignore[attr-defined]
    logs.log_attempt(report("HTTP 503 from https://x/s3cret-value"))
    line = captured.getvalue().strip()
    assert "s3cret-value" not in line
    if form == "json":
        entry = json.loads(line)
        assert entry["event"] == 12
        assert entry["attempt"] == "2/7"
        assert entry["total"] == 2
        assert entry["next"] == "1970-01-01T00:02:00.000Z"
        assert entry["error"] == "HTTP 503 from https://x/***"
        assert entry["level"] == "info"
    else:
        assert (
            "attempt event=12 route=orders target=crm delivery=31 attempt=2/7 total=2 outcome=retry"
            " status=503 duration_ms=12.4 next=1970-01-01T00:02:00.000Z"
        ) in line
        assert 'error="HTTP 503 from https://x/***"' in line


def test_the_attempt_that_makes_a_delivery_dead_says_dead(captured: io.StringIO) -> None:
    logs.configure(LogConfig(format="text"))
    logging.getLogger().handlers[0].setStream(captured)  # type: ignore[attr-defined]
    last = dataclasses.replace(
        report("HTTP 503"),
        number=7,
        cycle_step=7,
        then=Dead("HTTP 503"),
    )
    logs.log_attempt(last)
    line = captured.getvalue().strip()
    assert " WARNING " in line
    assert "attempt=7/7 total=7 outcome=dead status=503" in line
    assert "next=dead" in line
    assert "outcome=retry" not in line


@pytest.mark.parametrize(
    ("number", "kind", "step", "said"),
    [
        # A manual retry of a dead delivery that had its 4 attempts: not "5/4".
        (5, AttemptKind.MANUAL, None, "attempt=manual total=5 outcome=dead"),
        # The first attempt of the cycle a requeue started: not "6/9".
        (6, AttemptKind.CYCLE, 1, "attempt=1/4 total=6 outcome=dead"),
        (3, AttemptKind.PROBE, None, "attempt=probe total=3 outcome=dead"),
    ],
)
def test_the_attempt_count_is_the_cycles_and_says_manual_retries_and_probes(
    captured: io.StringIO, number: int, kind: AttemptKind, step: int | None, said: str
) -> None:
    logs.configure(LogConfig(format="text"))
    logging.getLogger().handlers[0].setStream(captured)  # type: ignore[attr-defined]
    entry = dataclasses.replace(
        report("HTTP 503"),
        number=number,
        kind=kind,
        cycle_step=step,
        cycle_length=4,
        then=Dead("HTTP 503"),
    )
    logs.log_attempt(entry)
    assert said in captured.getvalue()


def test_text_fields_are_quoted_only_when_their_text_needs_it(captured: io.StringIO) -> None:
    logs.configure(LogConfig(format="text"))
    logging.getLogger().handlers[0].setStream(captured)  # type: ignore[attr-defined]
    fields = {
        "n": 3,
        "f": 1.5,
        "none": None,
        "flag": True,
        "empty": "",
        "plain": "a/b:c",
        "space": "a b",
        "quote": 'say "hi"',
        "eq": "k=v",
    }
    logging.getLogger("relay.test").info("line", extra={"fields": fields})
    line = captured.getvalue().strip()
    assert line.endswith(
        'line n=3 f=1.5 none=- flag=True empty="" plain=a/b:c space="a b"'
        ' quote="say \\"hi\\"" eq="k=v"'
    ), line


def test_url_credentials_are_masked() -> None:
    masker = Masker()
    assert masker.text("cannot reach http://user:pw@host/x") == "cannot reach http://***@host/x"
    assert masker.header("Authorization", "Bearer abc") == "***"
    assert masker.header("X-Plain", "abc") == "abc"


def test_storable_text_replaces_what_utf8_cannot_hold() -> None:
    from relay.core.payload import storable

    assert storable("plain ключ") == "plain ключ"
    assert storable("x/\udcff") == "x/\ufffd"


def test_a_secret_is_masked_in_its_encoded_forms_too() -> None:
    masker = Masker(["s3cret/value x"])
    assert masker.text("?t=s3cret%2Fvalue+x&u=s3cret%2Fvalue%20x") == "?t=***&u=***"
    assert masker.text("s3cret/value x") == "***"


def test_credential_fields_are_masked_by_name_whatever_their_encoding() -> None:
    from relay.core.secrets import mask_fields

    assert (
        mask_fields("Name=Anna&api%5Fkey=k%2F1&token=t+1&x=1")
        == "Name=Anna&api%5Fkey=***&token=***&x=1"
    )


def test_a_secret_url_still_says_which_host() -> None:
    masker = Masker(["https://example.bitrix24.ru/rest/1/abc123def456"])
    shown = masker.text("POST https://example.bitrix24.ru/rest/1/abc123def456/crm.lead.add.json")
    assert shown == "POST https://example.bitrix24.ru/***/crm.lead.add.json"
    assert Masker(["https://h:8443/x/key1"]).text("https://h:8443/x/key1") == "https://h:8443/***"


@pytest.mark.parametrize(
    "moments",
    [
        [0.0, 0.999, 1.0, 1.9999996],  # one second twice, the next, a rounding up
        [1733011199.9995, 1733011200.0004, 1733011200.5],  # across midnight UTC
        [1733011200.25, 1733011199.75, 1733011200.001],  # a clock stepped back
    ],
)
def test_a_line_has_its_own_millisecond_though_its_second_is_formatted_once(
    moments: list[float],
) -> None:
    for created in moments:
        record = logging.LogRecord("relay", logging.INFO, __file__, 1, "m", None, None)
        record.created = created
        moment = datetime.fromtimestamp(created, UTC)  # as each line was formatted before
        expected = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
        assert logs._timestamp(record) == expected


def test_a_secret_url_ending_in_a_slash_keeps_it_before_what_follows() -> None:
    """`${CRM_URL}crm.lead.add.json` with CRM_URL ending in `/`: shown as
    `https://host/***/crm.lead.add.json`, never `***crm.lead.add.json`."""
    masker = Masker(["https://example.bitrix24.ru/rest/1/abc123def456/"])
    shown = masker.text("https://example.bitrix24.ru/rest/1/abc123def456/crm.lead.add.json")
    assert shown == "https://example.bitrix24.ru/***/crm.lead.add.json"
