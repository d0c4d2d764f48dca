"""Ingest: `relay serve` (synchronous = "full") against a bare aiohttp handler, under wrk.

    python bench/ingest.py [--seconds 10] [--rounds 3] [--connections 64] [--threads 1,2,4]

The server runs on CPU 1 and wrk on CPU 0. wrk runs with 1, 2 and 4 threads
against each server, its own CPU measured, and each server's best rate
counts: one wrk thread on one core caps a bare handler below what it can
do, and a ratio against a generator-capped baseline flatters relay. A
baseline measured with the generator saturated is flagged, not reported as
the result. Rounds alternate: a bare aiohttp
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


def thread_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("expected thread counts such as 1,2,4")
    return counts


def best(results: list[WrkResult]) -> WrkResult:
    return max(results, key=lambda result: result.rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=thread_counts,
        default=[1, 2, 4],
        help="wrk threads to try for each server (default 1,2,4): each server's best"
        " counts, so that the generator is not what limits the baseline",
    )
    parser.add_argument("--synchronous", default="full", choices=["full", "normal"])
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let the scheduler place wrk and the server (as on a VPS), instead of one core each",
    )
    args = parser.parse_args()

    target_port = black_hole()
    names = ("bare", "lowlevel", "relay")
    # Per server, per round: one result per thread count.
    results: dict[str, list[list[WrkResult]]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        for round_number in range(args.rounds):
            for name in names:
                tried: list[WrkResult] = []
                best_cpu = 0.0
                for threads in args.threads:
                    port = free_port()
                    if name == "bare":
                        command = [
                            sys.executable,
                            str(ROOT / "bench" / "bare_server.py"),
                            str(port),
                        ]
                    elif name == "lowlevel":
                        command = [
                            sys.executable,
                            str(ROOT / "bench" / "bare_lowlevel.py"),
                            str(port),
                        ]
                    else:
                        config = relay_config(folder, port, target_port, args.synchronous)
                        command = [*relay_command(), "serve", "--config", str(config)]
                    server = Server(command, port, cpu=None if args.no_pin else 1)
                    try:
                        result, used = load_webhooks(
                            server,
                            connections=args.connections,
                            seconds=args.seconds,
                            prefix=round_number * 100 + threads,
                            cpu=None if args.no_pin else 0,
                            threads=threads,
                        )
                    finally:
                        server.stop()
                    tried.append(result)
                    if result is best(tried):
                        best_cpu = used / max(result.acked, 1) * 1000
                    flag = "  GENERATOR SATURATED" if result.saturated else ""
                    print(
                        f"round {round_number + 1} {name:8} wrk -t{threads}:"
                        f" {result.rate:8.0f} req/s  p99 {result.p99:6.1f} ms"
                        f"  wrk CPU {result.generator_cores:4.2f} cores{flag}",
                        flush=True,
                    )
                results[name].append(tried)
                cpu[name].append(best_cpu)
        database = sqlite3.connect(folder / "relay.db")
        stored = database.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        database.close()

    acked = sum(r.acked for tried in results["relay"] for r in tried)
    in_flight_allowance = args.connections * args.rounds * len(args.threads)
    lost = max(0, acked - stored)
    labels = {"bare": "bare aiohttp app", "lowlevel": "bare aiohttp low-level", "relay": "relay"}

    # Each thread count on its own, then each server's best of them.
    rows = []
    for index, threads in enumerate(args.threads):
        bare_rate = statistics.median(tried[index].rate for tried in results["bare"])
        for name in names:
            rate = statistics.median(tried[index].rate for tried in results[name])
            cores = statistics.median(tried[index].generator_cores for tried in results[name])
            rows.append(
                [
                    f"-t{threads}",
                    labels[name],
                    f"{rate:.0f}",
                    f"{cores:.2f}",
                    f"{rate / bare_rate:.2f}x",
                ]
            )
    print_table(
        "each wrk thread count (median of rounds)",
        ["wrk", "server", "req/s", "wrk cores", "rate"],
        rows,
    )

    bests = {name: [best(tried) for tried in results[name]] for name in names}
    bare_rate = statistics.median(r.rate for r in bests["bare"])
    bare_p99 = statistics.median(r.p99 for r in bests["bare"])
    rows = []
    for name in names:
        rate = statistics.median(r.rate for r in bests[name])
        p99 = statistics.median(r.p99 for r in bests[name])
        rows.append(
            [
                labels[name],
                f"{rate:.0f}",
                ",".join(str(r.threads) for r in bests[name]),
                f"{statistics.median(r.p50 for r in bests[name]):.1f}",
                f"{p99:.1f}",
                f"{statistics.median(r.p999 for r in bests[name]):.1f}",
                f"{statistics.median(cpu[name]):.3f}",
                f"{rate / bare_rate:.2f}x",
                f"{p99 / bare_p99:.2f}x",
            ]
        )
    print_table(
        f"ingest, {args.connections} connections, ~1 KiB JSON, synchronous = {args.synchronous},"
        f" each server's best of wrk -t{','.join(map(str, args.threads))},"
        f" median of {args.rounds} rounds of {args.seconds:g}s",
        ["server", "req/s", "best -t", "p50 ms", "p99 ms", "p99.9 ms", "CPU s/1k", "rate", "p99"],
        rows,
    )
    print("(rate and p99 are against the bare aiohttp app handler, the baseline the goal names)")
    capped = [r for r in bests["bare"] if r.saturated]
    honest = not capped
    if capped:
        print(
            f"FLAGGED: in {len(capped)} of {args.rounds} rounds the generator was saturated"
            " at the baseline's best rate: the baseline may be wrk's limit, so the ratio is"
            " an upper bound, not a result (raise --threads, or give wrk more cores)"
        )
    print(f"\nacknowledged by relay: {acked}, in the database: {stored}, lost: {lost}")
    path = write_json(
        "ingest",
        {
            "args": vars(args),
            "results": results,
            "cpu_per_1k": cpu,
            "generator_saturated_at_baseline": not honest,
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
