"""Peer baseline: the tutorial's FastAPI + Redis RPUSH receiver against relay.

    python bench/peer.py [--seconds 10] [--rounds 3]

Both at equal durability: Redis runs with `appendonly yes` and
`appendfsync always` (every write fsynced before the reply), relay with
`synchronous = "full"`. The receiver and its Redis share CPU 1, as relay and
its SQLite do; wrk runs on CPU 0 with the same load as bench/ingest.py.
Needs redis-server (Debian: apt-get install redis-server) and the bench
extras (pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    Server,
    WrkResult,
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
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=2, help="wrk threads (its CPU is reported and checked)"
    )
    args = parser.parse_args()
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
    target_port = black_hole()
    results: dict[str, list[WrkResult]] = {"peer": [], "relay": []}
    with tempfile.TemporaryDirectory(prefix="relay-peer-") as tmp:
        folder = Path(tmp)
        for round_number in range(args.rounds):
            for name in ("peer", "relay"):
                port = free_port()
                servers = []
                if name == "peer":
                    redis_port = free_port()
                    servers.append(
                        Server(
                            [
                                redis_server,
                                "--port",
                                str(redis_port),
                                "--bind",
                                "127.0.0.1",
                                "--save",
                                "",
                                "--appendonly",
                                "yes",
                                "--appendfsync",
                                "always",
                                "--dir",
                                str(folder),
                            ],
                            redis_port,
                            cpu=1,
                        )
                    )
                    command = [
                        sys.executable,
                        str(ROOT / "bench" / "peer_server.py"),
                        str(port),
                        str(redis_port),
                    ]
                else:
                    config = relay_config(folder, port, target_port, "full")
                    command = [*relay_command(), "serve", "--config", str(config)]
                servers.append(Server(command, port, cpu=1))
                try:
                    result = run_wrk(
                        f"http://127.0.0.1:{port}/hooks/orders",
                        connections=args.connections,
                        seconds=args.seconds,
                        prefix=round_number,
                        cpu=0,
                        threads=args.threads,
                    )
                finally:
                    for server in reversed(servers):
                        server.stop()
                results[name].append(result)
                print(
                    f"round {round_number + 1} {name:5}: {result.rate:8.0f} req/s"
                    f"  p99 {result.p99:6.1f} ms  errors {result.errors + result.non2xx}"
                    f"  wrk CPU {result.generator_cores:.2f} cores"
                    + ("  GENERATOR SATURATED: not a result" if result.saturated else ""),
                    flush=True,
                )
    peer_rate = statistics.median(r.rate for r in results["peer"])
    rows = []
    for name in ("peer", "relay"):
        rate = statistics.median(r.rate for r in results[name])
        rows.append(
            [
                "FastAPI + Redis (appendfsync always)"
                if name == "peer"
                else "relay (synchronous=full)",
                f"{rate:.0f}",
                f"{statistics.median(r.p50 for r in results[name]):.1f}",
                f"{statistics.median(r.p99 for r in results[name]):.1f}",
                f"{rate / peer_rate:.2f}x",
            ]
        )
    print_table(
        f"peer baseline, {args.connections} connections, ~1 KiB JSON, median of {args.rounds}",
        ["server", "req/s", "p50 ms", "p99 ms", "vs peer"],
        rows,
    )
    print(f"results: {write_json('peer', {'args': vars(args), 'results': results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
