"""Malformed requests are refused with one log line each, and not too many lines.

Before: aiohttp logged each as an ERROR with an 11-line traceback; ~900 of them
exhausted journald's default rate limit and relay's attempt lines went with them.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from relay.ingress.httplog import LINES_PER_WINDOW, WINDOW_SECONDS, RefusedRequests

from conftest import ConfigFactory, RelayFactory

MALFORMED = (
    b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /orders\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
)


async def test_each_refusal_is_one_line_and_a_flood_is_capped(
    make_config: ConfigFactory, start_relay: RelayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    relay = await start_relay(
        make_config(
            {"audit": {"type": "file", "path": "out.jsonl"}},
            {"orders": {"path": "/orders", "targets": ["audit"]}},
        ),
        background=False,
    )
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    caplog.set_level(logging.INFO)
    for number in range(60):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(MALFORMED[number % len(MALFORMED)])
        answer = await asyncio.wait_for(reader.read(1000), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer
    lines = [record for record in caplog.records if record.name == "relay.http"]
    # (the window may already be partly used by earlier tests in this process)
    assert len(lines) <= LINES_PER_WINDOW
    for record in lines:
        assert record.levelno == logging.WARNING
        assert record.exc_info is None
        assert "\n" not in record.getMessage()
        assert record.getMessage().startswith("refused a malformed request from 127.0.0.1: ")
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_lines_left_out_are_counted_in_the_next_window() -> None:
    now = [0.0]
    refused = RefusedRequests(clock=lambda: now[0])

    def record() -> logging.LogRecord:
        error = BadHttpMessage("Invalid header")
        return logging.LogRecord(
            "relay.http", logging.ERROR, __file__, 1, "Error handling request from %s",
            ("203.0.113.9",), (BadHttpMessage, error, None),
        )  # fmt: skip

    kept = [refused.filter(record()) for _ in range(LINES_PER_WINDOW + 5)]
    assert kept.count(True) == LINES_PER_WINDOW
    now[0] += WINDOW_SECONDS
    line = record()
    assert refused.filter(line)
    assert line.getMessage() == (
        "refused a malformed request from 203.0.113.9: Invalid header (5 more not logged)"
    )
