"""Whose are a lone sender's slow answers: relay's, or the disk's?

    python bench/lone_stalls.py [--seconds 10] [--rounds 3] [--slow 3]

relay (synchronous = "full") runs on CPU 1. On CPU 0 a blocking socket posts
~1 KiB webhooks one after another, timing each answer, while a probe in
another process appends 12 KiB to a file in relay's folder and fdatasyncs it
every 10 ms, timing each sync (both on CLOCK_MONOTONIC, so their times
compare). An answer slower than --slow ms that overlaps a probe's sync slower
than half that is counted as the disk's: a stall every fsyncing process on
the disk saw at once. Reported per round: the slow answers, how many were the
disk's, and the p99 as wrk counts it (bench/common.as_wrk_counts) with every
answer, and with the disk's slow answers counted at the round's median
instead. bench/lone_sender.py measures the goal; this says where its tail
comes from. The probe adds ~100 fsyncs a second of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, Server, as_wrk_counts, body_1kib, free_port, percentile, relay_command
from ingest import black_hole, relay_config
from raw_sender import read_answer, webhook_request

PROBE = """
import json, os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
syncs = []
ends = time.monotonic() + seconds
while time.monotonic() < ends:
    os.write(fd, b"x" * 12288)
    began = time.monotonic()
    os.fdatasync(fd)
    syncs.append((began, time.monotonic() - began))
    time.sleep(0.01)
os.close(fd)
os.unlink(path)
print(json.dumps(syncs))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--slow", type=float, default=3.0, help="a slow answer, in ms (the goal's p99)"
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    target_port = black_hole()
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        for round_number in range(args.rounds):
            port = free_port()
            config = relay_config(folder, port, target_port, "full")
            server = Server([*relay_command(), "serve", "--config", str(config)], port, cpu=1)
            probe = subprocess.Popen(
                [sys.executable, "-c", PROBE, str(folder / "probe.bin"), str(args.seconds + 0.5)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            try:
                answers = timed_answers(port, args.seconds, round_number)
            finally:
                server.stop()
            syncs: list[tuple[float, float]] = json.loads(probe.communicate()[0])
            report(round_number, answers, syncs, args.seconds, args.slow / 1000)
    return 0


def timed_answers(port: int, seconds: float, prefix: int) -> list[tuple[float, float]]:
    """(sent at, seconds to the answer) of each webhook, one after another."""
    body = body_1kib().encode()
    answers: list[tuple[float, float]] = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            request = webhook_request(f"stall-{prefix}-{len(answers)}", body)
            began = time.monotonic()
            sock.sendall(request)
            read_answer(sock)
            answers.append((began, time.monotonic() - began))
    return answers


def report(
    round_number: int,
    answers: list[tuple[float, float]],
    syncs: list[tuple[float, float]],
    seconds: float,
    slow: float,
) -> None:
    slow_syncs = [(began, began + took) for began, took in syncs if took > slow / 2]
    median = statistics.median(took for _, took in answers)
    slow_answers = disks = 0
    without_disk: list[float] = []
    for began, took in answers:
        disk = took > slow and any(s < began + took and began < e for s, e in slow_syncs)
        slow_answers += took > slow
        disks += disk
        without_disk.append(median if disk else took)
    interval = seconds * 1000 / len(answers)
    every = as_wrk_counts(sorted(took * 1000 for _, took in answers), interval)
    kept = as_wrk_counts(sorted(took * 1000 for took in without_disk), interval)
    print(
        f"round {round_number + 1}: {len(answers)} answers, {slow_answers} over"
        f" {slow * 1000:g} ms, {disks} of them the disk's (the probe's sync was slow"
        f" then too; its slowest {max(took for _, took in syncs) * 1000:.1f} ms);"
        f" p99 as wrk counts {percentile(every, 0.99):.2f} ms,"
        f" without the disk's {percentile(kept, 0.99):.2f} ms",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
