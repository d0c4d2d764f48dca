"""The running service logs what a database command did (issue 55, item 9):
`sudo relay pause crm` is its own process, and the service's journal would
otherwise show deliveries stop for no reason."""

from __future__ import annotations

import logging

import pytest

from relay.background.noticed import READ_AT_ONCE, ActionsNoticed
from relay.store import Selection, Status, Store

T0 = 1_800_000_000.0


async def test_a_database_commands_action_is_said_once_and_the_services_own_never(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    await store.set_paused("crm", True, T0, by="cli user anna")  # before the start
    noticed = ActionsNoticed(store)
    assert await noticed.look() == []  # history, not news
    await store.set_paused("mail", True, T0 + 1, by="cli user anna")
    await store.requeue(Selection(status=Status.DEAD), T0 + 2, by="cli user boris")
    await store.set_paused("crm", False, T0 + 3, by="dashboard session 1a2b from 127.0.0.1")
    with caplog.at_level(logging.INFO, logger="relay.audit"):
        said = await noticed.look()
        assert await noticed.look() == []  # once
    assert [(e.action, e.by) for e in said] == [
        ("pause", "cli user anna"),
        ("requeue", "cli user boris"),
    ]
    lines = [r for r in caplog.records if "by a database command" in r.getMessage()]
    assert [r.fields["action"] for r in lines] == ["pause", "requeue"]  # type: ignore[attr-defined]


async def test_more_actions_than_read_at_once_are_counted(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:

    noticed = ActionsNoticed(store)
    await noticed.look()
    for n in range(READ_AT_ONCE + 7):
        await store.set_paused("crm", n % 2 == 0, T0 + n, by="cli user anna")
    with caplog.at_level(logging.INFO, logger="relay.audit"):
        said = await noticed.look()
    assert len(said) == READ_AT_ONCE
    assert any("7" in r.getMessage() and "relay audit" in r.getMessage() for r in caplog.records)
