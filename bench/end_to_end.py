"""End to end: webhooks in through relay, out to an HTTP target, at a steady rate.

    python bench/end_to_end.py [--seconds 60] [--rates 1000,2000,2500,3000]

relay runs on CPU 1; wrk (paced) and the target (a local aiohttp sink that
answers 200) share CPU 0. For each rate: received and delivered per second
over the load window, whether delivery kept up (the backlog at the end under
one second of traffic), and the ingest→delivered latency (the sink's arrival
time minus the event's received_at). The highest rate that keeps up is then
run again at half that rate for the latency figure.

The baseline, measured first in the same run: a minimal forwarder
(bench/forwarder_server.py, one aiohttp handler that forwards each POST to the
same sink with the same aiohttp client and stores nothing), driven flat out by
the same wrk. Its rate is the most any relay could deliver on this machine;
relay's highest rate that keeps up is reported as a ratio of it. relay sends
with its own client (relay.targets.outbound.client), leaner than aiohttp's; the same
forwarder sending with that client is measured too, and relay's ratio to it
is what storage and scheduling cost on their own.
"""

from __future__ import annotations

import argparse
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
    machine_busy,
    print_table,
    relay_command,
    relay_to_sink_config,
    run_wrk,
    write_json,
)


def delivered_so_far(admin_port: int) -> int:
    return crm_counts(admin_port, timeout=10).get("delivered", 0)


def run_at(
    rate: float,
    seconds: float,
    concurrency: int,
    round_number: int,
    threads: int = 2,
    transport: str | None = None,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="relay-e2e-") as tmp:
        folder = Path(tmp)
        port, admin_port, sink_port = free_port(), free_port(), free_port()
        arrivals = folder / "arrivals.txt"
        sink = Server(
            [sys.executable, str(ROOT / "bench" / "sink_server.py"), str(sink_port), str(arrivals)],
            sink_port,
            cpu=0,
        )
        config = relay_to_sink_config(
            folder, port, admin_port, sink_port, concurrency, transport=transport
        )
        relay = Server([*relay_command(), "serve", "--config", str(config)], port, cpu=1)
        try:
            relay_before, sink_before = relay.cpu_seconds(), sink.cpu_seconds()
            machine_before = machine_busy()
            result = run_wrk(
                f"http://127.0.0.1:{port}/hooks/orders",
                connections=64,
                seconds=seconds,
                prefix=round_number,
                cpu=0,
                rate=rate,
                threads=threads,
            )
            machine_after = machine_busy()
            relay_cpu = relay.cpu_seconds() - relay_before
            sink_cpu = sink.cpu_seconds() - sink_before
            delivered_in_window = delivered_so_far(admin_port)
            deadline = time.monotonic() + 60
            while delivered_so_far(admin_port) < result.acked and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            relay.stop()
            sink.stop()
        database = sqlite3.connect(folder / "relay.db")
        received = dict(database.execute("SELECT id, received_at FROM events"))
        database.close()
        latencies = sorted(
            float(at) - received[int(event)]
            for event, at in (line.split() for line in arrivals.read_text().splitlines())
            if event.isdigit() and int(event) in received
        )
    got = result.acked / result.seconds
    out = delivered_in_window / result.seconds
    ticks = machine_after[1] - machine_before[1]
    cores = (os.cpu_count() or 1) * (machine_after[0] - machine_before[0]) / max(ticks, 1.0)
    return {
        # relay's CPU for each event taken in and delivered, over the window.
        "relay_us_per_event": 1e6 * relay_cpu / max(delivered_in_window, 1),
        "relay_cores": relay_cpu / result.seconds,
        # The whole machine's busy cores over the window, and what was not
        # relay, the sink or wrk: other engineers' tests sharing it.
        "machine_cores": cores,
        "others_cores": max(
            0.0, cores - (relay_cpu + sink_cpu) / result.seconds - result.generator_cores
        ),
        "target_rate": rate,
        "received_per_s": got,
        "delivered_per_s": out,
        "backlog_at_end": result.acked - delivered_in_window,
        "kept_up": float(result.acked - delivered_in_window <= max(got, 1.0)),
        "latency_p50_ms": _percentile(latencies, 50) * 1000,
        "latency_p99_ms": _percentile(latencies, 99) * 1000,
        "ack_p99_ms": result.p99,
        "lost": float(max(0, result.acked - len(received))),
        "generator_cores": result.generator_cores,
        "generator_saturated": float(result.saturated),
    }


def forwarder_rate(
    seconds: float, concurrency: int, client: str, threads: int = 2
) -> dict[str, float]:
    """The minimal forwarder flat out: what reached the sink per second."""
    with tempfile.TemporaryDirectory(prefix="relay-e2e-") as tmp:
        arrivals = Path(tmp) / "arrivals.txt"
        port, sink_port = free_port(), free_port()
        sink = Server(
            [sys.executable, str(ROOT / "bench" / "sink_server.py"), str(sink_port), str(arrivals)],
            sink_port,
            cpu=0,
        )
        forwarder = Server(
            [
                sys.executable,
                str(ROOT / "bench" / "forwarder_server.py"),
                str(port),
                f"http://127.0.0.1:{sink_port}/hook",
                str(concurrency),
                client,
            ],
            port,
            cpu=1,
        )
        try:
            result = run_wrk(
                f"http://127.0.0.1:{port}/hooks/orders",
                connections=64,
                seconds=seconds,
                prefix=0,
                cpu=0,
                threads=threads,
            )
        finally:
            forwarder.stop()
            sink.stop()
        delivered = len(arrivals.read_text().splitlines())
    return {
        "received_per_s": result.acked / result.seconds,
        "delivered_per_s": min(delivered, result.acked) / result.seconds,
        "ack_p50_ms": result.p50,
        "ack_p99_ms": result.p99,
        "generator_cores": result.generator_cores,
        "generator_saturated": float(result.saturated),
    }


def _percentile(values: list[float], percent: float) -> float:
    if not values:
        return float("nan")
    index = min(len(values) - 1, round(percent / 100 * (len(values) - 1)))
    return values[index]


def compare_transports(args: argparse.Namespace) -> int:
    """Each rate run for each transport in turn (the order swapped every
    round), so both meet the same neighbours on a shared machine; the ratio
    of each pair is what is compared, never raw figures across runs."""
    transports = args.transports.split(",")
    rates = [float(r) for r in args.rates.split(",")]
    runs: list[dict[str, float | str]] = []
    for number in range(args.rounds):
        order = transports if number % 2 == 0 else transports[::-1]
        for rate in rates:
            for transport in order:
                run: dict[str, float | str] = {
                    **run_at(rate, args.seconds, args.concurrency, number, args.threads, transport),
                    "transport": transport,
                    "round": number,
                }
                runs.append(run)
                print(
                    f"round {number} {transport:>8} target {rate:.0f}/s: delivered"
                    f" {run['delivered_per_s']:.0f}/s, kept up {bool(run['kept_up'])},"
                    f" relay {run['relay_us_per_event']:.0f} us/event,"
                    f" machine {run['machine_cores']:.2f} cores busy"
                    f" (others {run['others_cores']:.2f}), p99 {run['latency_p99_ms']:.0f} ms",
                    flush=True,
                )
    base = transports[0]
    rows = []
    for number in range(args.rounds):
        for rate in rates:
            mine = {
                str(r["transport"]): r
                for r in runs
                if r["round"] == number and r["target_rate"] == rate
            }
            row = [str(number), f"{rate:.0f}"]
            for transport in transports:
                row += [
                    f"{mine[transport]['delivered_per_s']:.0f}",
                    "yes" if mine[transport]["kept_up"] else "no",
                    f"{mine[transport]['relay_us_per_event']:.0f}",
                ]
            for transport in transports[1:]:
                delivered = float(mine[transport]["delivered_per_s"])
                cost = float(mine[transport]["relay_us_per_event"])
                base_delivered = float(mine[base]["delivered_per_s"])
                base_cost = float(mine[base]["relay_us_per_event"])
                row.append(f"{delivered / base_delivered:.2f} / {cost / base_cost:.2f}")
            row.append(f"{max(float(r['others_cores']) for r in mine.values()):.2f}")
            rows.append(row)
    headers = ["round", "rate"]
    for transport in transports:
        headers += [f"{transport} deliv/s", "kept up", "us/event"]
    headers += [f"{t}/{base} deliv, us" for t in transports[1:]] + ["others cores"]
    print_table(
        f"end to end by transport, concurrency {args.concurrency}, {args.seconds:g}s a run",
        headers,
        rows,
    )
    for number in range(args.rounds):
        best = {}
        for transport in transports:
            kept = [
                float(r["received_per_s"])
                for r in runs
                if r["round"] == number
                and r["transport"] == transport
                and r["kept_up"]
                and r["lost"] == 0
            ]
            best[transport] = max(kept, default=0.0)
        said = ", ".join(f"{t} {v:.0f}/s" for t, v in best.items())
        ratios = ", ".join(
            f"{t}/{base} {best[t] / best[base]:.2f}" for t in transports[1:] if best[base]
        )
        print(f"round {number}: highest rate kept up: {said} ({ratios})")
    print(f"results: {write_json('end_to_end_transports', {'args': vars(args), 'runs': runs})}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rates", default="1000,2000,2500,3000,4000")
    parser.add_argument("--concurrency", type=int, default=32, help="the target's concurrency")
    parser.add_argument(
        "--threads", type=int, default=2, help="wrk threads (its CPU is reported and checked)"
    )
    parser.add_argument(
        "--transports",
        default="",
        help='compare the target\'s transports ("relay,aiohttp"): each rate is run'
        " for each, alternately, --rounds times, and their ratios reported",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --transports")
    args = parser.parse_args()
    if args.transports:
        return compare_transports(args)
    baseline = forwarder_rate(min(args.seconds, 20), args.concurrency, "aiohttp", args.threads)
    lean = forwarder_rate(min(args.seconds, 20), args.concurrency, "relay", args.threads)
    for name, rates in (("aiohttp's client", baseline), ("relay's client", lean)):
        print(
            f"baseline, a minimal forwarder with {name} flat out:"
            f" {rates['delivered_per_s']:.0f}/s delivered, ack p99 {rates['ack_p99_ms']:.1f} ms,"
            f" wrk CPU {rates['generator_cores']:.2f} cores"
            + ("  GENERATOR SATURATED: not a result" if rates["generator_saturated"] else ""),
            flush=True,
        )
    rows = []
    runs = []
    best = None
    for number, rate in enumerate(float(r) for r in args.rates.split(",")):
        run = run_at(rate, args.seconds, args.concurrency, number, args.threads)
        runs.append(run)
        print(
            f"target {rate:.0f}/s: received {run['received_per_s']:.0f}/s, delivered"
            f" {run['delivered_per_s']:.0f}/s, backlog at end {run['backlog_at_end']:.0f},"
            f" latency p99 {run['latency_p99_ms']:.0f} ms",
            flush=True,
        )
        if run["kept_up"] and run["lost"] == 0:
            best = run
    half = None
    if best is not None:
        half = run_at(best["received_per_s"] / 2, args.seconds, args.concurrency, 99, args.threads)
        runs.append(half)
    for run in runs:
        rows.append(
            [
                f"{run['target_rate']:.0f}",
                f"{run['received_per_s']:.0f}",
                f"{run['delivered_per_s']:.0f}",
                f"{run['backlog_at_end']:.0f}",
                "yes" if run["kept_up"] else "no",
                f"{run['latency_p50_ms']:.0f}",
                f"{run['latency_p99_ms']:.0f}",
                f"{run['ack_p99_ms']:.1f}",
                f"{run['lost']:.0f}",
            ]
        )
    print_table(
        f"end to end, one HTTP target (concurrency {args.concurrency}), {args.seconds:g}s a rate",
        [
            "rate",
            "received/s",
            "delivered/s",
            "backlog",
            "kept up",
            "e2e p50 ms",
            "e2e p99 ms",
            "ack p99 ms",
            "lost",
        ],
        rows,
    )
    if best is not None and half is not None:
        print(
            f"\nhighest rate kept up: {best['received_per_s']:.0f}/s"
            f" ({best['received_per_s'] / baseline['delivered_per_s']:.2f}x the minimal"
            f" forwarder's {baseline['delivered_per_s']:.0f}/s, "
            f"{best['received_per_s'] / lean['delivered_per_s']:.2f}x its"
            f" {lean['delivered_per_s']:.0f}/s with relay's client);"
            f" at half of it ({half['received_per_s']:.0f}/s) ingest→delivered"
            f" p50 {half['latency_p50_ms']:.0f} ms, p99 {half['latency_p99_ms']:.0f} ms"
        )
    median_lost = statistics.median(run["lost"] for run in runs) if runs else 0
    data = {"args": vars(args), "baseline": baseline, "lean_baseline": lean, "runs": runs}
    print(f"results: {write_json('end_to_end', data)}")
    return 1 if median_lost else 0


if __name__ == "__main__":
    sys.exit(main())
