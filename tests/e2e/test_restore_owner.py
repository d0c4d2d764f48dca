"""A backup restored as root into the service's state folder: the service's
user cannot open it. The one line relay says names the file's owner and the
fix (it said "database cannot be written: unable to open database file").

Run as root: the service's user is an unprivileged uid (setpriv), as
systemd's DynamicUser= gives it (see tests/deploy/test_guide.py).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another user")

SERVICE_UID = 61236  # in systemd's DynamicUser= range, no account


@pytest.fixture
def state() -> Iterator[Path]:
    # Not under pytest's tmp_path (mode 700, root's): the service's user must reach it.
    top = Path(tempfile.mkdtemp(prefix="relay-restore-", dir="/var/tmp"))
    top.chmod(0o755)
    folder = top / "state"
    folder.mkdir(mode=0o700)
    os.chown(folder, SERVICE_UID, SERVICE_UID)
    try:
        yield folder
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_root_owned_restore_is_named_with_its_owner_and_the_fix(state: Path) -> None:
    config = write_config(
        state.parent / "relay.toml",
        {
            "storage": {"path": str(state / "relay.db")},
            "admin": {"enabled": False},
            "targets": {"audit": {"type": "file", "path": str(state / "audit.jsonl")}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
        },
    )
    config.chmod(0o644)
    backup = state.parent / "backup.db"
    sqlite3.connect(backup).close()
    # operate.md's old restore: `sudo cp backup relay.db` into the service's folder.
    shutil.copyfile(backup, state / "relay.db")
    (state / "relay.db").chmod(0o600)
    served = subprocess.run(
        [
            "setpriv",
            f"--reuid={SERVICE_UID}",
            f"--regid={SERVICE_UID}",
            "--clear-groups",
            sys.executable,
            "-P",
            "-m",
            "relay",
            "serve",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": "/"},
    )
    assert served.returncode != 0
    said = served.stderr
    assert "Traceback" not in said, said
    assert (
        f"{state / 'relay.db'} is owned by root (uid 0), mode 600, and relay runs as uid"
        f" {SERVICE_UID}" in said
    ), said
    assert f"sudo chown --reference={state} {state / 'relay.db'}" in said
    # The fix it names works.
    subprocess.run(["chown", f"--reference={state}", str(state / "relay.db")], check=True)
    assert (state / "relay.db").stat().st_uid == SERVICE_UID
