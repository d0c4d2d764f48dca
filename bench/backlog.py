"""Backlog: a million pending deliveries (the target was down), then it comes back.

    python bench/backlog.py [--events 1000000] [--concurrency 32] [--ordered 10]

1. Fills a database with pending deliveries through the store's own write path,
   timing one scheduler tick (claim 100 due deliveries and give them back,
   plus the next-due lookup) at 1k, 100k and 1M pending: it should not grow.
2. Starts `relay serve` (CPU 1) on that database with the target up (a local
   sink on CPU 0): time until it listens, the drain rate, relay's RSS
   sampled through the run, and the database size per event.

With `--ordered N` the route's target has `order_by`: the backlog is
events/N keys of N deliveries each, so all but the first of each key wait
their turn (no due time). The tick must stay as flat as without it; the
drain checks that every key's deliveries arrived in order of receipt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    Server,
    crm_counts,
    free_port,
    print_table,
    relay_command,
    relay_to_sink_config,
    write_json,
)

from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent, SqliteStore
from relay.store.migrations import migrate
from relay.store.sqlite.accept import SqliteAccept

CHECKPOINTS = (1_000, 100_000, 1_000_000)
BODY = (b'{"event":"order.created","order":{"id":%d,"currency":"RUB","total":1990}}').ljust(512)


def order_key(n: int, keys: int) -> str | None:
    return f"k{n % keys}" if keys else None


def fill(path: Path, start: int, stop: int, keys: int = 0) -> None:
    """Pending deliveries, written the way ingress writes them (many per commit)."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = NORMAL")  # only to fill faster
    migrate(connection)
    now = time.time()
    headers = [("Content-Type", "application/json"), ("Idempotency-Key", "x")]
    for first in range(start, stop, 5000):
        jobs = [
            SqliteAccept(
                NewEvent(
                    "orders",
                    f"order-{n}",
                    now,
                    "127.0.0.1",
                    Payload("POST", "/hooks/orders", "", headers, "application/json", BODY % n),
                ),
                [NewDelivery("crm", order_key=order_key(n, keys))],
                now,
            )
            for n in range(first, min(first + 5000, stop))
        ]
        connection.execute("BEGIN IMMEDIATE")
        SqliteAccept.run_many(connection, jobs)
        connection.execute("COMMIT")
    connection.close()


async def tick_cost(path: Path, repeats: int = 30) -> float:
    """Median seconds of one scheduler tick against this database."""
    store = SqliteStore(path, synchronous="normal")
    await store.open()
    try:
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            claimed = await store.claim_due(time.time() + 10, time.time() + 60, {"crm": 100})
            await store.next_due(["crm"])
            timings.append(time.perf_counter() - started)
            await store.release([c.id for c in claimed], time.time())
        return statistics.median(timings)
    finally:
        await store.close()


def pending(admin_port: int) -> int:
    counts = crm_counts(admin_port)
    return counts.get("pending", 0) + counts.get("in_flight", 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--ordered",
        type=int,
        default=0,
        metavar="N",
        help="order_by on the target, N deliveries per key (default: unordered)",
    )
    args = parser.parse_args()
    keys = max(1, args.events // args.ordered) if args.ordered else 0
    checkpoints = [n for n in CHECKPOINTS if n < args.events] + [args.events]
    ticks = {}
    with tempfile.TemporaryDirectory(prefix="relay-backlog-") as tmp:
        folder = Path(tmp)
        database = folder / "relay.db"
        done = 0
        fill_started = time.perf_counter()
        for checkpoint in checkpoints:
            fill(database, done, checkpoint, keys)
            done = checkpoint
            ticks[checkpoint] = asyncio.run(tick_cost(database))
            print(
                f"{checkpoint:>9} pending: one tick (claim 100, next due) takes"
                f" {ticks[checkpoint] * 1000:.2f} ms",
                flush=True,
            )
        print(f"filled in {time.perf_counter() - fill_started:.0f}s")
        size = sum(p.stat().st_size for p in folder.glob("relay.db*"))

        port, admin_port, sink_port = free_port(), free_port(), free_port()
        sink = Server(
            [
                sys.executable,
                str(ROOT / "bench" / "sink_server.py"),
                str(sink_port),
                str(folder / "arrivals.txt"),
            ],
            sink_port,
            cpu=0,
        )
        # A million attempt lines in the log are not the point here.
        path = relay_to_sink_config(
            folder,
            port,
            admin_port,
            sink_port,
            args.concurrency,
            log_level="warning",
            # The keys are in the stored rows already; the template is for new events.
            order_by="{{ json.order.id }}" if keys else None,
        )
        started = time.perf_counter()
        relay = Server([*relay_command(), "serve", "--config", str(path)], port, cpu=1)
        start_seconds = time.perf_counter() - started
        rss: list[float] = []
        try:
            drain_started = time.perf_counter()
            left = args.events
            next_poll = 0.0
            while left > 0 and time.perf_counter() - drain_started < 3600:
                rss.append(relay.rss_mib())
                if time.perf_counter() >= next_poll:
                    left = pending(admin_port)
                    next_poll = time.perf_counter() + 2
                time.sleep(0.5)
            drain_seconds = time.perf_counter() - drain_started
        finally:
            relay.stop()
            sink.stop()
        arrivals = [int(line.split()[0]) for line in (folder / "arrivals.txt").open()]
        delivered = len(arrivals)
        out_of_order = misordered(arrivals, keys) if keys else 0

    if keys:
        print(f"ordered: {keys:,} keys; arrivals out of their key's order: {out_of_order}")
    rate = delivered / drain_seconds
    rows = [[f"{n:,}", f"{ticks[n] * 1000:.2f}"] for n in checkpoints]
    print_table("scheduler tick vs backlog", ["pending", "tick ms"], rows)
    print_table(
        f"backlog of {args.events:,} pending deliveries, target back (concurrency"
        f" {args.concurrency})",
        ["start s", "drain s", "delivered/s", "RSS max MiB", "RSS median MiB", "DB bytes/event"],
        [
            [
                f"{start_seconds:.2f}",
                f"{drain_seconds:.0f}",
                f"{rate:.0f}",
                f"{max(rss):.0f}",
                f"{statistics.median(rss):.0f}",
                f"{size / args.events:.0f}",
            ]
        ],
    )
    result = {
        "args": vars(args),
        "tick_seconds": ticks,
        "start_seconds": start_seconds,
        "drain_seconds": drain_seconds,
        "delivered": delivered,
        "delivered_per_s": rate,
        "rss_max_mib": max(rss),
        "db_bytes_per_event": size / args.events,
        "keys": keys,
        "out_of_order": out_of_order,
    }
    print(f"results: {write_json('backlog', result)}")
    return 0 if delivered >= args.events and not out_of_order else 1


def misordered(event_ids: list[int], keys: int) -> int:
    """Arrivals that came before an earlier-received delivery of their key
    (event id n + 1 carries the key of n, as `fill` wrote it)."""
    last: dict[str, int] = {}
    wrong = 0
    for event_id in event_ids:
        key = order_key(event_id - 1, keys) or ""
        if event_id < last.get(key, 0):
            wrong += 1
        last[key] = max(event_id, last.get(key, 0))
    return wrong


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
