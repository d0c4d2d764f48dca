"""PgBouncer in front of a throwaway cluster (tests/pgcluster.py): Debian's
`pgbouncer` package, a unix socket in a temporary folder, no TCP port.

PgBouncer will not run as root: as the cluster, it runs as the `postgres`
user through runuser when the tests do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pgcluster import SUPERUSER, Cluster

PORT = 6432


def pgbouncer_bin() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


@contextlib.contextmanager
def pgbouncer(cluster: Cluster, pool_mode: str) -> Iterator[str]:
    """PgBouncer with `pool_mode` ("session", "transaction") in front of
    `cluster`; yields the URL template `postgresql://relay@/{database}?...`."""
    binary = pgbouncer_bin()
    assert binary is not None
    folder = Path(tempfile.mkdtemp(prefix="relay-pgbouncer-"))
    (folder / "users.txt").write_text(f'"{SUPERUSER}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={cluster.socket_dir}\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        f"listen_port = {PORT}\n"
        f"unix_socket_dir = {folder}\n"
        "auth_type = trust\n"
        f"auth_file = {folder}/users.txt\n"
        f"pool_mode = {pool_mode}\n"
        f"logfile = {folder}/pgbouncer.log\n"
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        for path in folder.iterdir():
            shutil.chown(path, "postgres", "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not (folder / f".s.PGSQL.{PORT}").exists():
            assert process.poll() is None, (folder / "pgbouncer.log").read_text()
            assert time.monotonic() < deadline, "pgbouncer did not start"
            time.sleep(0.05)
        yield f"postgresql://{SUPERUSER}@/{{database}}?host={folder}&port={PORT}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
