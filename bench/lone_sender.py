"""A lone sender: one connection, one request at a time, as a Tilda form feels relay.

    python bench/lone_sender.py [--seconds 10] [--rounds 3]

wrk with one connection posts ~1 KiB JSON webhooks back to back, each waiting
for the answer to the one before, against the bare aiohttp app handler (the
baseline), aiohttp's low-level server, and relay (synchronous = "full", so
every answer waits for its own fsynced commit). The server runs on CPU 1 and
wrk on CPU 0. Then bench/raw_sender.py, a blocking socket, does the same
for as long: it reports each request's own latency, where wrk corrects for
coordinated omission and so counts a stall by its length (see raw_sender.py).
Reported: the acknowledgement's p50 and p99 by each client; every webhook
relay acknowledged must be in its database afterwards. Each round ends with
bench/fsync_floor.py in the same folder: the disk's own fdatasync times, and
the same as wrk would count them at relay's pace in that round, so relay's
tail can be read against what no fsyncing server gets under.

    TMPDIR=/dev/shm python bench/lone_sender.py

runs it all on tmpfs, where an fsync costs nothing: relay's own tail (its
threads, its background work, the GIL), with no disk under it.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    Server,
    WrkResult,
    cpu_prefix,
    free_port,
    print_table,
    relay_command,
    run_wrk,
    write_json,
)
from ingest import black_hole, relay_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    target_port = black_hole()
    commands = {
        "bare aiohttp app": [sys.executable, str(ROOT / "bench" / "bare_server.py")],
        "bare aiohttp low-level": [sys.executable, str(ROOT / "bench" / "bare_lowlevel.py")],
        "relay": [*relay_command(), "serve", "--config"],
    }
    results: dict[str, list[WrkResult]] = {
        f"{name}{client}": [] for name in commands for client in ("", ", raw socket")
    }
    floors: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        for round_number in range(args.rounds):
            for name, command in commands.items():
                port = free_port()
                if name == "relay":
                    config = relay_config(folder, port, target_port, "full")
                    command = [*command, str(config)]
                else:
                    command = [*command, str(port)]
                server = Server(command, port, cpu=1)
                try:
                    by_wrk = run_wrk(
                        f"http://127.0.0.1:{port}/hooks/orders",
                        connections=1,
                        seconds=args.seconds,
                        prefix=round_number,
                        cpu=0,
                    )
                    by_socket = raw_sender(port, args.seconds, round_number)
                finally:
                    server.stop()
                for client, result in (("", by_wrk), (", raw socket", by_socket)):
                    results[name + client].append(result)
                    print(
                        f"round {round_number + 1} {name + client:34}: p50 {result.p50:5.2f} ms"
                        f"  p99 {result.p99:5.2f} ms  ({result.rate:.0f} req/s)",
                        flush=True,
                    )
            # The disk alone, at relay's pace by wrk in this round.
            floors.append(fsync_floor(folder, args.seconds, 1000 / results["relay"][-1].rate))
            print(
                f"round {round_number + 1} {'fdatasync alone':34}: p99 {floors[-1]['p99']:5.2f} ms,"
                f" as wrk counts {floors[-1]['as_wrk_counts']['p99']:5.2f} ms",
                flush=True,
            )
        database = sqlite3.connect(folder / "relay.db")
        stored = database.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        database.close()

    rows = []
    for name, runs in results.items():
        rows.append(
            [
                name,
                f"{statistics.median(r.p50 for r in runs):.2f}",
                f"{statistics.median(r.p99 for r in runs):.2f}",
                f"{statistics.median(r.p999 for r in runs):.2f}",
                f"{statistics.median(r.rate for r in runs):.0f}",
            ]
        )
    for name, floor in (
        ("fdatasync alone (the disk's floor)", floors),
        ("fdatasync alone, as wrk counts", [f["as_wrk_counts"] for f in floors]),
    ):
        rows.append(
            [
                name,
                *(f"{statistics.median(f[q] for f in floor):.2f}" for q in ("p50", "p99", "p999")),
                f"{statistics.median(f['syncs'] / f['seconds'] for f in floors):.0f}",
            ]
        )
    print_table(
        f"a lone sender: 1 connection, ~1 KiB JSON, median of {args.rounds} rounds"
        f" of {args.seconds:g}s",
        ["server", "p50 ms", "p99 ms", "p99.9 ms", "req/s"],
        rows,
    )
    acked = sum(r.acked for r in [*results["relay"], *results["relay, raw socket"]])
    lost = max(0, acked - stored)
    print(f"\nacknowledged by relay: {acked}, in the database: {stored}, lost: {lost}")
    path = write_json(
        "lone_sender",
        {
            "args": vars(args),
            "results": results,
            "fsync_floor": floors,
            "acked": acked,
            "stored": stored,
            "lost": lost,
        },
    )
    print(f"results: {path}")
    # One connection per client: at most one request each a round may be cut
    # off unanswered (stored, never acknowledged).
    if lost or stored > acked + 2 * args.rounds:
        print("FAILED: acknowledged events are missing from the database")
        return 1
    return 0


def fsync_floor(folder: Path, seconds: float, interval_ms: float) -> dict[str, Any]:
    return run_json("fsync_floor.py", folder, seconds, interval_ms, cpu=1)


def raw_sender(port: int, seconds: float, round_number: int) -> WrkResult:
    return WrkResult(**run_json("raw_sender.py", port, seconds, round_number, cpu=0))


def run_json(script: str, *args: object, cpu: int) -> dict[str, Any]:
    """Run one of bench/'s scripts on `cpu`; the JSON line it prints."""
    output = subprocess.run(
        [*cpu_prefix(cpu), sys.executable, str(ROOT / "bench" / script), *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[str, Any] = json.loads(output)
    return found


if __name__ == "__main__":
    sys.exit(main())
