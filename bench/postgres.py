"""PostgreSQL beside SQLite: ingest and end to end, one and three relay instances.

    python bench/postgres.py [--seconds 10] [--connections 64] [--rounds 1]
        [--pin-db CPU] [--setups sqlite,"postgres x1","postgres x3"] [--modes ingest,end-to-end]
        [--concurrency 32] [--top N] [--instance-cpu CORES]

Needs Debian's postgresql (a throwaway cluster is started as in the tests:
tests/pgcluster.py, a unix socket, no TCP) and wrk. For each setup (SQLite;
PostgreSQL with one instance; with three, wrk's connections split between
them) two runs:

- ingest: the target never answers (concurrency 1), so only accepting is
  measured: acknowledged per second, p99, and CPU seconds per 1,000 events of
  relay (all instances) and of the PostgreSQL server (postmaster and its
  backends) separately;
- end to end: the target is a local sink answering 200; wrk flat out for the
  window, then until everything acknowledged is delivered: events delivered
  per second over the whole run, ingest-to-delivery p99, the same CPU split.

Every acknowledged event must be in the database afterwards (a benchmark that
loses events fails). With `--pin-db CPU` the PostgreSQL server (postmaster,
its helpers and every backend it forks) runs on that CPU alone and relay,
the sink and wrk on the others: the database as its own host, so that what
more instances deliver is not bought with its CPU. PostgreSQL's statements
per delivered event are counted by pg_stat_statements (preloaded in the
throwaway cluster). From the PostgreSQL CPU per event it projects how many
events a second a database host with N cores could take, CPU-bound.

With `--instance-cpu CORES` each relay instance runs in a cgroup of its own
held to that share of a CPU (root; cgroup v1 or v2): each instance as its own
small host, so that three instances have three times the CPU of one even on
a machine with a core or two. What they then deliver beyond one instance is
what the shared database and its locks let through.

This machine has 2 shared cores: run it only on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from common import (
    ROOT,
    CpuQuota,
    Server,
    WrkResult,
    free_port,
    print_table,
    relay_command,
    relay_to_sink_config,
    run_wrk,
    write_json,
)
from ingest import black_hole

from pgcluster import Cluster, create_cluster, remove_cluster

SETUPS = ("sqlite", "postgres x1", "postgres x3")


def pg_cpu_seconds(cluster: Cluster) -> float:
    """User + system CPU of the postmaster, its live backends and those that ended."""
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = cluster.postmaster_pid()
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == postmaster:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


async def _pg(url: str, sql: str) -> Any:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetch(sql)
    finally:
        await connection.close()


def stored_events(folder: Path, url: str | None) -> dict[int, float]:
    sql = "SELECT id, received_at FROM events"
    if url is None:
        database = sqlite3.connect(folder / "relay.db")
        try:
            return dict(database.execute(sql).fetchall())
        finally:
            database.close()
    return {row[0]: row[1] for row in asyncio.run(_pg(url, sql))}


def delivered_count(folder: Path, url: str | None) -> int:
    sql = "SELECT COUNT(*) FROM deliveries WHERE status = 'delivered'"
    if url is None:
        database = sqlite3.connect(folder / "relay.db")
        try:
            return int(database.execute(sql).fetchone()[0])
        finally:
            database.close()
    return int(asyncio.run(_pg(url, sql))[0][0])


def wrk_all(
    ports: list[int], connections: int, seconds: float, prefix: int, cpu: str | None
) -> list[WrkResult]:
    """wrk against each instance at once, the connections split between them."""
    results: list[WrkResult] = []
    share = max(1, connections // len(ports))

    def one(index: int, port: int) -> None:
        results.append(
            run_wrk(
                f"http://127.0.0.1:{port}/hooks/orders",
                connections=share,
                seconds=seconds,
                prefix=prefix * 10 + index,
                cpu=cpu,
            )
        )

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(ports)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def pin_server(cluster: Cluster, cpu: int) -> None:
    """The postmaster and its children on `cpu`; backends forked later inherit it."""
    postmaster = cluster.postmaster_pid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if int(entry) == postmaster or parent == postmaster:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(entry), {cpu})


def others(cpu: int | None) -> str | None:
    """Every CPU but `cpu`, as taskset reads a list."""
    if cpu is None:
        return None
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)) if c != cpu)


OURS = "query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE 'SELECT COUNT(*)%'"


def statements(url: str) -> int:
    """Statements PostgreSQL ran so far (pg_stat_statements), ours excluded."""
    rows = asyncio.run(
        _pg(url, f"SELECT COALESCE(SUM(calls), 0) FROM pg_stat_statements WHERE {OURS}")
    )
    return int(rows[0][0])


def reset_statements(url: str) -> None:
    asyncio.run(_pg(url, "SELECT pg_stat_statements_reset()"))


def top_statements(url: str, events: int, limit: int) -> list[str]:
    """The statements run most often since the last reset, per event, with
    PostgreSQL's own time in them (its execution; parse and network aside)."""
    rows = asyncio.run(
        _pg(
            url,
            "SELECT calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g')"
            f" FROM pg_stat_statements WHERE {OURS} ORDER BY calls DESC LIMIT {int(limit)}",
        )
    )
    return [
        f"  {calls / max(events, 1):6.3f}/event {1000 * ms / max(calls, 1):7.0f} µs  {query[:110]}"
        for calls, ms, query in rows
    ]


def run_setup(
    setup: str, mode: str, cluster: Cluster, args: argparse.Namespace, round_number: int
) -> dict[str, Any]:
    count = int(setup.rsplit("x", 1)[1]) if "x" in setup else 1
    cpu = others(args.pin_db)
    with tempfile.TemporaryDirectory(prefix="relay-bench-pg-") as tmp:
        folder = Path(tmp)
        if cluster.as_postgres:
            os.chmod(folder, 0o755)
        url = None
        if setup != "sqlite":
            name = f"bench_{round_number}_{mode.replace('-', '_')}_{count}"
            asyncio.run(_pg(cluster.url("postgres"), f"DROP DATABASE IF EXISTS {name}"))
            asyncio.run(_pg(cluster.url("postgres"), f"CREATE DATABASE {name}"))
            url = cluster.url(name)
            asyncio.run(_pg(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        sink = None
        arrivals = folder / "arrivals.txt"
        if mode == "ingest":
            target_port = black_hole()
        else:
            target_port = free_port()
            sink = Server(
                [
                    sys.executable,
                    str(ROOT / "bench" / "sink_server.py"),
                    str(target_port),
                    str(arrivals),
                ],
                target_port,
                cpu=cpu,
            )
        relays = []
        quotas: list[CpuQuota] = []
        try:
            for _ in range(count):
                port = free_port()
                held: list[str] = []
                if args.instance_cpu:
                    quotas.append(CpuQuota(f"relay-bench-{port}", args.instance_cpu))
                    held = quotas[-1].prefix()
                path = relay_to_sink_config(
                    folder,
                    port,
                    free_port(),
                    target_port,
                    args.concurrency,
                    log_level="warning",
                    storage_url=url,
                    name=f"relay-{port}.toml",
                )
                relays.append(
                    Server(
                        [*held, *relay_command(), "serve", "--config", str(path)],
                        port,
                        cpu=cpu,
                        cwd=folder,
                    )
                )
            relay_before = sum(r.cpu_seconds() for r in relays)
            pg_before = pg_cpu_seconds(cluster)
            if url:
                reset_statements(url)
            started = time.monotonic()
            results = wrk_all(
                [r.port for r in relays], args.connections, args.seconds, round_number, cpu
            )
            acked = sum(r.acked for r in results)
            if mode == "end-to-end":
                deadline = time.monotonic() + 120
                while delivered_count(folder, url) < acked and time.monotonic() < deadline:
                    time.sleep(0.2)
            elapsed = time.monotonic() - started
            relay_cpu = sum(r.cpu_seconds() for r in relays) - relay_before
            pg_cpu = pg_cpu_seconds(cluster) - pg_before if url else 0.0
            ran = statements(url) if url else 0
            top = top_statements(url, acked, args.top) if url and args.top else []
        finally:
            for relay in relays:
                relay.stop()
            if sink is not None:
                sink.stop()
            for quota in quotas:
                quota.remove()
        received = stored_events(folder, url)
        lost = max(0, acked - len(received))
        latencies = []
        if mode == "end-to-end" and arrivals.exists():
            latencies = sorted(
                float(at) - received[int(event)]
                for event, at in (line.split() for line in arrivals.read_text().splitlines())
                if event.isdigit() and int(event) in received
            )
    window = results[0].seconds if results else args.seconds
    return {
        "rate": acked / (window if mode == "ingest" else elapsed),
        "p99_ms": max(r.p99 for r in results) if mode == "ingest" else _p99(latencies) * 1000,
        "relay_cpu_per_1k": relay_cpu / max(acked, 1) * 1000,
        "pg_cpu_per_1k": pg_cpu / max(acked, 1) * 1000,
        "statements_per_event": ran / max(acked, 1),
        "acked": float(acked),
        "lost": float(lost),
        "top": top,
    }


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pin-db", type=int, default=None, metavar="CPU")
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--modes", default="ingest,end-to-end")
    parser.add_argument(
        "--top", type=int, default=0, metavar="N", help="list each run's N most run statements"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="the target's concurrency, a limit for the whole cluster: while it binds, more"
        " instances cannot deliver more (raise it to see what the instances themselves can)",
    )
    parser.add_argument(
        "--instance-cpu",
        type=float,
        default=0.0,
        metavar="CORES",
        help="hold each relay instance to this share of a CPU (a cgroup of its own)",
    )
    args = parser.parse_args()

    cluster = create_cluster()
    # pg_stat_statements, for the statements each delivered event costs.
    with (cluster.directory / "data" / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
    cluster.stop()
    cluster.start()
    if args.pin_db is not None:
        pin_server(cluster, args.pin_db)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for round_number in range(args.rounds):
            for mode in args.modes.split(","):
                for setup in args.setups.split(","):
                    result = run_setup(setup, mode, cluster, args, round_number)
                    results.setdefault(f"{mode} {setup}", []).append(result)
                    print(
                        f"round {round_number + 1} {mode:10} {setup:12}: {result['rate']:7.0f}/s"
                        f"  p99 {result['p99_ms']:7.1f} ms  relay {result['relay_cpu_per_1k']:.3f}"
                        f"  pg {result['pg_cpu_per_1k']:.3f} CPU s/1k"
                        f"  {result['statements_per_event']:.2f} statements/event"
                        f"  lost {result['lost']:.0f}",
                        flush=True,
                    )
                    for line in result["top"]:
                        print(line, flush=True)
    finally:
        remove_cluster(cluster)

    rows = []
    for key, runs in results.items():
        rows.append(
            [
                key,
                f"{statistics.median(r['rate'] for r in runs):.0f}",
                f"{statistics.median(r['p99_ms'] for r in runs):.1f}",
                f"{statistics.median(r['relay_cpu_per_1k'] for r in runs):.3f}",
                f"{statistics.median(r['pg_cpu_per_1k'] for r in runs):.3f}",
                f"{statistics.median(r['statements_per_event'] for r in runs):.2f}",
            ]
        )
    print_table(
        f"PostgreSQL beside SQLite, {args.connections} connections, ~1 KiB JSON,"
        f" median of {args.rounds} rounds of {args.seconds:g}s"
        + (f", each instance held to {args.instance_cpu:g} of a CPU" if args.instance_cpu else ""),
        ["run", "events/s", "p99 ms", "relay CPU s/1k", "PostgreSQL CPU s/1k", "statements/event"],
        rows,
    )
    # Sizing counts what the database spends on a delivered event (its intake,
    # claim, attempt record and index upkeep), not on accepting it alone.
    delivered = results.get("end-to-end postgres x3") or results.get("end-to-end postgres x1") or []
    per_1k = statistics.median(r["pg_cpu_per_1k"] for r in delivered) if delivered else 0.0
    if per_1k > 0:
        for cores in (1, 2, 4, 8):
            print(
                f"a database host with {cores} core(s): ~{cores / per_1k * 1000:.0f} delivered"
                " events/s before its CPU is the limit (disk and network aside)"
            )
    lost = sum(r["lost"] for runs in results.values() for r in runs)
    path = write_json("postgres", {"args": vars(args), "results": results, "lost": lost})
    print(f"results: {path}")
    if lost:
        print("FAILED: acknowledged events are missing from the database")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
