"""Stages: several versions of relay's ingest side by side, each against the bare handler.

    python bench/stages.py [--seconds 5] [--rounds 5] NAME=SOURCE_TREE ...

    git worktree add /tmp/before <commit>
    python bench/stages.py before=/tmp/before now=.

    # the compiled hot path against the pure one: a SOURCE_TREE may be the
    # site-packages of a virtual environment holding the compiled wheel
    python3 -m venv /tmp/compiled && RELAY_MYPYC=1 /tmp/compiled/bin/pip install .
    python bench/stages.py pure=. compiled=/tmp/compiled/lib/python3.11/site-packages

What a change bought, in µs of CPU per webhook, needs its before and after
measured in one sitting: this host's speed moves by up to 1.4x between
sittings. Each round runs the bare aiohttp app handler, then each version
(imported from its SOURCE_TREE through PYTHONPATH) on a new database, under
bench/ingest.py's load and pinning. A version's database is deleted and the
page cache synced after its run, so one version's writeback does not land
in the next one's fsyncs (it did: later rounds ran up to 20 % slower).
Printed: each version's rate as a share of the bare handler's in the same
round, the median of those shares, and CPU per webhook.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, Server, WrkResult, free_port, load_webhooks, print_table, write_json
from ingest import black_hole, relay_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("versions", nargs="+", metavar="NAME=SOURCE_TREE")
    args = parser.parse_args()
    versions = {}
    for spec in args.versions:
        name, _, tree = spec.partition("=")
        if not tree or not (Path(tree) / "relay" / "__init__.py").exists():
            parser.error(f"{spec}: give NAME=PATH, PATH a source tree holding relay/")
        versions[name] = str(Path(tree).resolve())
    target_port = black_hole()
    names = ["bare", *versions]
    runs: dict[str, list[tuple[WrkResult, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="relay-stages-") as tmp:
        for round_number in range(args.rounds):
            for name in names:
                port = free_port()
                folder = Path(tmp) / f"{name}-{round_number}"
                folder.mkdir()
                if name == "bare":
                    command = [sys.executable, str(ROOT / "bench" / "bare_server.py"), str(port)]
                    env = None
                    cwd = None
                else:
                    config = relay_config(folder, port, target_port, "full")
                    command = [sys.executable, "-m", "relay", "serve", "--config", str(config)]
                    env = {**os.environ, "PYTHONPATH": versions[name]}
                    # `python -m` puts its working directory first on sys.path:
                    # run from a checkout, it would import that checkout's relay
                    # for every version. The round's folder holds no relay.
                    cwd = folder
                    if round_number == 0:
                        check_imports(versions[name], env, cwd)
                server = Server(command, port, cpu=1, env=env, cwd=cwd)
                try:
                    result, used = load_webhooks(
                        server, connections=64, seconds=args.seconds, prefix=round_number, cpu=0
                    )
                finally:
                    server.stop()
                    shutil.rmtree(folder)
                    os.sync()
                micros = used / max(result.acked, 1) * 1e6
                runs[name].append((result, micros))
                print(
                    f"round {round_number + 1} {name:10} {result.rate:8.0f} req/s"
                    f"  {micros:5.1f} us  p99 {result.p99:5.1f} ms",
                    flush=True,
                )
    bare = [result.rate for result, _ in runs["bare"]]
    rows = []
    for name in names:
        shares = [result.rate / rate for (result, _), rate in zip(runs[name], bare, strict=True)]
        rows.append(
            [
                name,
                " ".join(f"{share:.2f}" for share in shares),
                f"{statistics.median(shares):.3f}x",
                f"{statistics.median(micros for _, micros in runs[name]):.1f}",
                f"{statistics.median(result.p99 for result, _ in runs[name]):.1f}",
            ]
        )
    print_table(
        f"ingest stages, 64 connections, median of {args.rounds} rounds of {args.seconds:g}s",
        ["version", "rate / bare, each round", "median", "us CPU/webhook", "p99 ms"],
        rows,
    )
    # Each version is its own tree, named on the command line: no one build to name.
    path = write_json(
        "stages", {"args": vars(args), "versions": versions, "runs": runs}, one_build=False
    )
    print(f"results: {path}")
    return 0


def check_imports(tree: str, env: dict[str, str], cwd: Path) -> None:
    """Stop unless a version's server, started as the round starts it, imports
    relay from that version's tree."""
    found = subprocess.run(
        [sys.executable, "-c", "import relay; print(relay.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree):
        sys.exit(f"a version meant to run from {tree} imports relay from {found}")


if __name__ == "__main__":
    sys.exit(main())
