"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries, a
temporary folder, a unix socket in it and no TCP port (nothing on the network).

`initdb` refuses to run as root and CI runs as root: then the cluster is made
and run as the `postgres` user (Debian's package creates it) through runuser.
Every test gets a database of its own, copied from a template that is already
migrated (procrastinate's way: `CREATE DATABASE ... TEMPLATE` is a file copy,
far cheaper than running the migrations again).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "relay"


async def run_sql(url: str, *statements: str) -> None:
    """Each statement in turn, on a connection of its own to `url`."""
    import asyncpg  # only the PostgreSQL tests need the driver

    connection = await asyncpg.connect(url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def database_of(url: str) -> str:
    """The database a cluster URL names (postgresql://user@/NAME?host=...)."""
    return url.split("@/")[1].split("?")[0]


async def commits_off(url: str) -> None:
    """synchronous_commit = off for the database at `url`, as a careless
    operator leaves it (sessions opened from now on inherit it)."""
    await run_sql(url, f"ALTER DATABASE {database_of(url)} SET synchronous_commit = off")


def server_bin() -> Path | None:
    """Where initdb and pg_ctl are: $PG_BIN, then Debian's newest version, then PATH."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class Cluster:
    directory: Path
    bin: Path
    as_postgres: bool

    @property
    def socket_dir(self) -> Path:
        return self.directory

    def url(self, database: str) -> str:
        # asyncpg (like libpq) takes a socket folder as the host.
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=60)

    def start(self) -> None:
        self.run(
            "pg_ctl",
            "-D",
            str(self.directory / "data"),
            "-l",
            str(self.directory / "server.log"),
            "-w",
            "-o",
            f"-k {self.socket_dir} -c listen_addresses='' -c max_connections=200"
            " -c fsync=on -c synchronous_commit=on",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.directory / "data"), "-m", mode, "-w", "stop")

    def postmaster_pid(self) -> int:
        return int((self.directory / "data" / "postmaster.pid").read_text().split()[0])

    def log_tail(self, lines: int = 30) -> str:
        path = self.directory / "server.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""


def create_cluster() -> Cluster:
    """initdb into a new temporary folder and start the server (about a second)."""
    bin_dir = server_bin()
    if bin_dir is None:
        raise FileNotFoundError("no PostgreSQL server binaries (apt-get install postgresql)")
    as_postgres = os.geteuid() == 0
    directory = Path(tempfile.mkdtemp(prefix="relay-pg-"))
    if as_postgres:
        shutil.chown(directory, "postgres", "postgres")
    cluster = Cluster(directory, bin_dir, as_postgres)
    cluster.run(
        "initdb", "-D", str(directory / "data"), "-A", "trust", "-U", SUPERUSER, "-E", "UTF8"
    )
    cluster.start()
    return cluster


def remove_cluster(cluster: Cluster) -> None:
    cluster.run(
        "pg_ctl", "-D", str(cluster.directory / "data"), "-m", "immediate", "stop", check=False
    )
    shutil.rmtree(cluster.directory, ignore_errors=True)
