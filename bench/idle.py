"""Idle: what relay costs with nothing arriving, after it has worked.

    python bench/idle.py [--seconds 30]

relay (synchronous = "full", one HTTP target at a local sink) takes a short
burst of webhooks (wrk, 2 s), is left to deliver and index them (10 s), and
is then watched with nothing arriving: CPU used over `--seconds` as a share
of one core, and its resident memory at the end. Beside it, in the same run,
the bare aiohttp app handler watched the same way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    Server,
    free_port,
    print_table,
    relay_command,
    relay_to_sink_config,
    run_wrk,
    write_json,
)


def watch(server: Server, seconds: float) -> tuple[float, float]:
    """CPU share of one core over `seconds`, and RSS in MiB at the end."""
    before = server.cpu_seconds()
    time.sleep(seconds)
    return (server.cpu_seconds() - before) / seconds, server.rss_mib()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    rows = []
    data: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="relay-idle-") as tmp:
        folder = Path(tmp)
        sink_port = free_port()
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
        try:
            for name in ("bare aiohttp app", "relay"):
                port = free_port()
                if name == "relay":
                    config = relay_to_sink_config(folder, port, free_port(), sink_port, 32)
                    command = [*relay_command(), "serve", "--config", str(config)]
                else:
                    command = [sys.executable, str(ROOT / "bench" / "bare_server.py"), str(port)]
                server = Server(command, port, cpu=1)
                try:
                    burst = run_wrk(
                        f"http://127.0.0.1:{port}/hooks/orders",
                        connections=16,
                        seconds=2,
                        prefix=0,
                        cpu=0,
                    )
                    time.sleep(10)  # delivered, indexed, settled
                    cpu, rss = watch(server, args.seconds)
                finally:
                    server.stop()
                data[name] = {"burst": burst.acked, "cpu_share": cpu, "rss_mib": rss}
                rows.append([name, f"{burst.acked}", f"{cpu * 100:.2f} %", f"{rss:.1f}"])
                print(f"{name}: {cpu * 100:.2f} % of a core, {rss:.1f} MiB", flush=True)
        finally:
            sink.stop()
    print_table(
        f"idle for {args.seconds:g}s after a 2 s burst",
        ["server", "burst", "CPU", "RSS MiB"],
        rows,
    )
    print(f"results: {write_json('idle', {'args': vars(args), 'servers': data})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
