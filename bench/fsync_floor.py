"""The disk's own floor under a lone sender: appends and fdatasyncs, nothing else.

    python bench/fsync_floor.py FOLDER SECONDS [INTERVAL_MS]

Appends 12 KiB (three 4 KiB pages, about what one webhook's commit adds to
SQLite's WAL) to a file in FOLDER and fdatasyncs it, over and over for
SECONDS, timing each. Prints one JSON line: syncs, seconds, and p50, p99,
p999 (ms) of each sync's own time, then the same as wrk would count them for
a server answering every INTERVAL_MS (default: this loop's own mean), whose
every answer waited for one such sync (common.as_wrk_counts).

No server that acknowledges after an fsync answers a lone sender faster than
this; bench/lone_sender.py runs it beside relay in each round, on the same
file system, so relay's tail can be read against the disk's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import as_wrk_counts, percentiles

PAGES = b"\0" * 3 * 4096
LIMIT = 64 * 1024 * 1024  # start the file over past this, as SQLite's WAL is reused


def main() -> int:
    folder, seconds = Path(sys.argv[1]), float(sys.argv[2])
    path = folder / "fsync-floor.bin"
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        started = time.monotonic()
        written = 0
        while time.monotonic() - started < seconds:
            began = time.perf_counter()
            os.pwrite(fd, PAGES, written)
            os.fdatasync(fd)
            times.append((time.perf_counter() - began) * 1000)
            written = (written + len(PAGES)) % LIMIT
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
        path.unlink()
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else elapsed * 1000 / len(times)
    counted = as_wrk_counts(times, interval)
    times.sort()
    print(
        json.dumps(
            {
                "syncs": len(times),
                "seconds": elapsed,
                **percentiles(times),
                "interval_ms": interval,
                "as_wrk_counts": percentiles(counted),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
