"""Ingest: `relay serve` (synchronous = "full") against a bare aiohttp handler, under wrk.

    python bench/ingest.py [--seconds 10] [--rounds 3] [--connections 64]

The server runs on CPU 1 and wrk on CPU 0. Rounds alternate: a bare aiohttp
app handler (the baseline), a bare handler on aiohttp's low-level server (the
layer relay's ingress uses), relay.
relay's one target hangs (concurrency 1, timeout 1h), so delivery does not
compete with ingest. After the run every acknowledged event must be in the
database; a benchmark that loses events fails.
"""

from __future__ import annotations

import argparse
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    Server,
    WrkResult,
    free_port,
    load_webhooks,
    print_table,
    relay_command,
    write_json,
)


def black_hole() -> int:
    """A target that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            connection, _ = listener.accept()
            held.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    port: int = listener.getsockname()[1]
    return port


def relay_config(folder: Path, port: int, target_port: int, synchronous: str) -> Path:
    path = folder / "relay.toml"
    path.write_text(f"""
[server]
listen = "127.0.0.1:{port}"
shutdown_timeout = "1s"

[storage]
path = "relay.db"
synchronous = "{synchronous}"

[targets.slow]
type = "http"
url = "http://127.0.0.1:{target_port}/hook"
concurrency = 1

[targets.slow.retry]
timeout = "1h"

[routes.orders]
path = "/hooks/orders"
targets = ["slow"]
""")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--synchronous", default="full", choices=["full", "normal"])
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let the scheduler place wrk and the server (as on a VPS), instead of one core each",
    )
    args = parser.parse_args()

    target_port = black_hole()
    names = ("bare", "lowlevel", "relay")
    results: dict[str, list[WrkResult]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        for round_number in range(args.rounds):
            for name in names:
                port = free_port()
                if name == "bare":
                    command = [sys.executable, str(ROOT / "bench" / "bare_server.py"), str(port)]
                elif name == "lowlevel":
                    command = [sys.executable, str(ROOT / "bench" / "bare_lowlevel.py"), str(port)]
                else:
                    config = relay_config(folder, port, target_port, args.synchronous)
                    command = [*relay_command(), "serve", "--config", str(config)]
                server = Server(command, port, cpu=None if args.no_pin else 1)
                try:
                    result, used = load_webhooks(
                        server,
                        connections=args.connections,
                        seconds=args.seconds,
                        prefix=round_number,
                        cpu=None if args.no_pin else 0,
                    )
                finally:
                    server.stop()
                results[name].append(result)
                cpu[name].append(used / max(result.acked, 1) * 1000)
                print(
                    f"round {round_number + 1} {name:5}: {result.rate:8.0f} req/s"
                    f"  p99 {result.p99:6.1f} ms",
                    flush=True,
                )
        database = sqlite3.connect(folder / "relay.db")
        stored = database.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        database.close()

    acked = sum(r.acked for r in results["relay"])
    in_flight_allowance = args.connections * args.rounds
    lost = max(0, acked - stored)
    rows = []
    bare_rate = statistics.median(r.rate for r in results["bare"])
    bare_p99 = statistics.median(r.p99 for r in results["bare"])
    labels = {"bare": "bare aiohttp app", "lowlevel": "bare aiohttp low-level", "relay": "relay"}
    for name in names:
        rate = statistics.median(r.rate for r in results[name])
        p99 = statistics.median(r.p99 for r in results[name])
        rows.append(
            [
                labels[name],
                f"{rate:.0f}",
                f"{statistics.median(r.p50 for r in results[name]):.1f}",
                f"{p99:.1f}",
                f"{statistics.median(r.p999 for r in results[name]):.1f}",
                f"{statistics.median(cpu[name]):.3f}",
                f"{rate / bare_rate:.2f}x",
                f"{p99 / bare_p99:.2f}x",
            ]
        )
    print_table(
        f"ingest, {args.connections} connections, ~1 KiB JSON, synchronous = {args.synchronous},"
        f" median of {args.rounds} rounds of {args.seconds:g}s",
        ["server", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "CPU s/1k", "rate", "p99"],
        rows,
    )
    print("(rate and p99 are against the bare aiohttp app handler, the baseline the goal names)")
    print(f"\nacknowledged by relay: {acked}, in the database: {stored}, lost: {lost}")
    path = write_json(
        "ingest",
        {
            "args": vars(args),
            "results": results,
            "cpu_per_1k": cpu,
            "acked": acked,
            "stored": stored,
            "lost": lost,
        },
    )
    print(f"results: {path}")
    if lost or stored > acked + in_flight_allowance:
        print("FAILED: acknowledged events are missing from the database")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
