"""Search by content at scale: build a store of N events, index it, time searches.

    python bench/search.py [--events 1000000] [--db PATH] [--repeat 5]

Events are stored through the store's own accept path (group commit), a mix of
Tilda form leads (Russian names, phones spelled every way), WooCommerce-like
JSON orders (~1 KiB) and T-Bank-like payment notifications. One lead carries
the phone `+7 (912) 345-67-89`; the benchmark asks for it as `89123456789`,
`79123456789` and `912 345 67 89` and fails unless exactly that event comes
back. The search index is then built by the real background indexer, and
searches run through the store's `list_events`, as the API, CLI and dashboard
run them: each query `--repeat` times, the first (cold) and the median shown.

Reported: build and indexing rates, bytes per event of the index (SQLite's
dbstat over the FTS5 tables), and search latencies. With --db an existing
database is reused (built once, searched many times); a new one is left in
a temporary directory and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import print_table, write_json

from relay.background.indexer import SearchIndexer
from relay.core.clock import SystemClock
from relay.core.payload import Payload
from relay.core.secrets import Masker
from relay.ops.search import parse_search
from relay.store import EventQuery, NewDelivery, NewEvent, SqliteStore, Status

NEEDLE_PHONE = "+7 (912) 345-67-89"
FIRST = ["Иван", "Мария", "Анна", "Ольга", "Сергей", "Дмитрий", "Елена", "Алексей", "John", "Kate"]
LAST = ["Иванов", "Петрова", "Смирнов", "Кузнецова", "Попов", "Соколова", "Лебедев", "Новикова"]
FORM = "application/x-www-form-urlencoded"


def phone(rng: random.Random) -> str:
    digits = f"9{rng.randint(0, 999_999_999):09d}"
    style = rng.randrange(4)
    if style == 0:
        return f"+7 ({digits[:3]}) {digits[3:6]}-{digits[6:8]}-{digits[8:]}"
    if style == 1:
        return "8" + digits
    if style == 2:
        return "7" + digits
    return f"8 {digits[:3]} {digits[3:6]} {digits[6:8]} {digits[8:]}"


def tilda(rng: random.Random, number: int, phone_text: str) -> tuple[str, bytes]:
    from urllib.parse import urlencode

    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    body = urlencode(
        {
            "Name": name,
            "Phone": phone_text,
            "Email": f"client{number}@example.ru",
            "Comment": "Перезвоните, пожалуйста, после обеда",
            "tranid": f"{number}:{rng.randint(0, 10**9)}",
            "formid": f"form{rng.randint(1, 30)}",
        }
    )
    return FORM, body.encode()


def order(rng: random.Random, number: int) -> tuple[str, bytes]:
    items = ",".join(
        f'{{"sku":"SKU-{rng.randint(0, 9999):04d}","name":"Товар {i}","qty":{i % 3 + 1}}}'
        for i in range(rng.randint(1, 8))
    )
    body = (
        f'{{"id":{number},"status":"processing","currency":"RUB",'
        f'"billing":{{"first_name":"{rng.choice(FIRST)}","last_name":"{rng.choice(LAST)}",'
        f'"email":"buyer{number}@mail.ru","phone":"{phone(rng)}","city":"Москва"}},'
        f'"line_items":[{items}]}}'
    )
    return "application/json", body.encode()


def payment(rng: random.Random, number: int) -> tuple[str, bytes]:
    body = (
        f'{{"TerminalKey":"1234567890DEMO","OrderId":"{number}","Success":true,'
        f'"Status":"CONFIRMED","PaymentId":{rng.randint(10**6, 10**8)},"ErrorCode":"0",'
        f'"Amount":{rng.randint(100, 10**6)},"Pan":"430000******0777"}}'
    )
    return "application/json", body.encode()


def make_event(rng: random.Random, number: int, needle: int) -> NewEvent:
    kind = number % 3
    if number == needle:
        content_type, body = tilda(rng, number, NEEDLE_PHONE)
    elif kind == 0:
        content_type, body = tilda(rng, number, phone(rng))
    elif kind == 1:
        content_type, body = order(rng, number)
    else:
        content_type, body = payment(rng, number)
    route = ("tilda", "shop", "tbank")[kind if number != needle else 0]
    return NewEvent(
        route=route,
        idempotency_key=None,
        received_at=1_800_000_000.0 + number,
        remote_addr="203.0.113.7",
        payload=Payload(
            method="POST",
            path=f"/hooks/{route}",
            query="",
            headers=[("Content-Type", content_type), ("User-Agent", "Bench/1.0")],
            content_type=content_type,
            body=body,
        ),
    )


async def build(store: SqliteStore, count: int, needle: int) -> float:
    rng = random.Random(17)
    started = time.perf_counter()
    chunk = 1000
    for start in range(0, count, chunk):
        events = [make_event(rng, n, needle) for n in range(start, min(count, start + chunk))]
        # Most delivered, some dead: a status filter has something to filter.
        await asyncio.gather(
            *(
                store.accept_event(
                    event,
                    [NewDelivery("crm", Status.DEAD if i % 50 == 0 else Status.SKIPPED)],
                    event.received_at,
                )
                for i, event in enumerate(events, start)
            )
        )
        if start and start % 100_000 == 0:
            print(f"  stored {start}", flush=True)
    return time.perf_counter() - started


def index_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'event_search%'"
        ).fetchone()
    return int(row[0] or 0)


async def timed(
    store: SqliteStore, query: EventQuery, repeat: int
) -> tuple[list[int], float, float]:
    times = []
    found: list[int] = []
    for _ in range(repeat):
        started = time.perf_counter()
        found = [event.id for event in await store.list_events(query)]
        times.append((time.perf_counter() - started) * 1000)
    return found, times[0], statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, help="reuse (or build once into) this database")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    temporary = None
    if args.db is None:
        temporary = Path(tempfile.mkdtemp(prefix="relay-search-"))
        path = temporary / "relay.db"
    else:
        path = args.db
    needle = args.events // 2 + 1  # 0-based number; its event id is one more
    store = SqliteStore(path, synchronous="normal")
    await store.open()
    try:
        stored = (await store.search_progress()).newest
        build_seconds = 0.0
        if stored < args.events:
            print(f"storing {args.events - stored} events in {path} ...", flush=True)
            if stored:
                raise SystemExit(f"{path} holds {stored} events, fewer than --events")
            build_seconds = await build(store, args.events, needle)
            print(f"stored {args.events} events in {build_seconds:.1f}s", flush=True)
        behind = (await store.search_progress()).behind
        print(f"indexing {behind} events ...", flush=True)
        # Pieces as large as the batch: nothing else writes here, so no
        # webhook waits behind them (relay.background.indexer.CHUNK).
        indexer = SearchIndexer(store, SystemClock(), Masker(), batch=500, chunk=500)
        started = time.perf_counter()
        indexed = await indexer.catch_up()
        index_seconds = time.perf_counter() - started
        total = (await store.search_progress()).newest
        size = await asyncio.to_thread(index_bytes, path)
        file_size = path.stat().st_size

        queries = [
            ("needle, as 89123456789", "89123456789", None),
            ("needle, as 79123456789", "79123456789", None),
            ("needle, as 912 345 67 89", "912 345 67 89", None),
            ("needle, as +7 (912) 345-67-89", NEEDLE_PHONE, None),
            ("a common name (page of 50)", "Ольга Петрова", None),
            ("a name, dead only", "Иванов", Status.DEAD),
            ("one e-mail", f"client{(args.events // 3) * 3}@example.ru", None),
            ("absent text", "Зыгмунтович", None),
            ("absent number", "89000000001", None),
            ("common words, rare phrase", "обеда перезвоните пожалуйста москва", None),
        ]
        rows = []
        results = []
        for label, text, status in queries:
            query = EventQuery(search=parse_search(text), status=status, limit=50)
            found, cold, median = await timed(store, query, args.repeat)
            if label.startswith("needle") and found != [needle + 1]:
                raise SystemExit(f"{label}: expected event {needle + 1}, found {found[:5]}")
            rows.append([label, str(len(found)), f"{cold:.1f}", f"{median:.1f}"])
            results.append(
                {"query": text, "label": label, "found": len(found), "cold_ms": cold, "ms": median}
            )
        print_table(
            f"search over {total} events",
            ["query", "found", "cold ms", "median ms"],
            rows,
        )
        summary = {
            "events": total,
            "store_seconds": round(build_seconds, 1),
            "index_seconds": round(index_seconds, 1),
            "indexed_per_second": round(indexed / index_seconds) if indexed else None,
            "index_bytes": size,
            "index_bytes_per_event": round(size / total) if total else None,
            "database_bytes": file_size,
            "queries": results,
        }
        print(
            f"\nindex: {size / 2**20:.1f} MiB, {summary['index_bytes_per_event']} bytes per event"
            f" (database {file_size / 2**20:.1f} MiB);"
            f" indexed {indexed} events in {index_seconds:.1f}s"
        )
        print(f"wrote {write_json('search', summary, one_build=False)}")
    finally:
        await store.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
