"""Files a config reads or names, refused while it is read (so by `relay check`
and by a reload alike) with one line naming the key or the file: each of these
once got past the reader and failed half-way through applying the config."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from relay.config import ConfigError
from relay.loader import load_config

from helpers import write_config


def config(tmp_path: Path, **targets: Any) -> dict[str, Any]:
    return {
        "storage": {"path": "relay.db"},
        "targets": targets or {"audit": {"type": "file", "path": "out/audit.jsonl"}},
        "routes": {"orders": {"path": "/hooks/orders", "targets": list(targets or ["audit"])}},
    }


def smtp(**extra: Any) -> dict[str, Any]:
    return {
        "type": "smtp",
        "host": "127.0.0.1",
        "from": "relay@example.com",
        "to": ["ops@example.com"],
        **extra,
    }


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(path, {})
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_byte_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = write_config(tmp_path / "relay.toml", config(tmp_path))
    path.write_bytes(path.read_bytes() + "# заказы\n".encode("cp1251"))
    lines = path.read_bytes().count(b"\n")
    message = refused(path)
    assert f"line {lines}: byte 0xe7 is not UTF-8" in message
    assert str(path) in message


def test_values_nested_too_deeply(tmp_path: Path) -> None:
    path = write_config(tmp_path / "relay.toml", config(tmp_path))
    for depth in (40, 100_000):  # one tomllib reads, one it cannot
        path.write_text(path.read_text() + f"\n[x{depth}]\nv = {'[' * depth}{']' * depth}\n")
        assert "nested more than 32 levels deep" in refused(path)
        path.write_text(path.read_text().split(f"\n[x{depth}]")[0])


def test_ca_file_missing_or_not_pem(tmp_path: Path) -> None:
    path = write_config(tmp_path / "relay.toml", config(tmp_path, mail=smtp(ca_file="ca.pem")))
    assert refused(path) == f"targets.mail.ca_file: {tmp_path / 'ca.pem'}: no such file"
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    assert "targets.mail.ca_file: " in refused(path)
    assert "not a PEM file of CA certificates" in refused(path)


def test_file_target_folder_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file, not a folder")
    for where in ("blocker/sub/audit.jsonl", "x" * 300 + "/audit.jsonl"):
        data = config(tmp_path, audit={"type": "file", "path": where})
        path = write_config(tmp_path / "relay.toml", data)
        assert refused(path).startswith("targets.audit.path: cannot create the folder ")
    fine = config(tmp_path, audit={"type": "file", "path": "new/deeper/audit.jsonl"})
    load_config(write_config(tmp_path / "relay.toml", fine), {})
    assert not (tmp_path / "new").exists()  # reading a config creates nothing


AS_SERVICE_UID = ["setpriv", "--reuid=61237", "--regid=61237", "--clear-groups"]


@pytest.mark.skipif(
    os.geteuid() != 0, reason="reads the config as another uid, as the service does"
)
def test_file_target_folder_the_service_user_cannot_create() -> None:
    """Under the unit, relay runs as a dynamic user on a read-only system but
    /var/lib/relay: a new file target at /srv/leads/leads.jsonl made the reload
    fail with "OSError: [Errno 30] Read-only file system: '/srv'", naming no key.
    The same as the user the service runs as: a root-owned folder it cannot write
    (pytest's tmp_path is root's alone, so a folder of its own that uid can enter)."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        root.chmod(0o755)
        (root / "srv").mkdir(mode=0o755)
        data = config(root, leads={"type": "file", "path": "srv/leads/leads.jsonl"})
        path = write_config(root / "relay.toml", data)
        path.chmod(0o644)
        script = (
            "import sys\n"
            "from pathlib import Path\n"
            "from relay.config import ConfigError\nfrom relay.loader import load_config\n"
            "try:\n    load_config(Path(sys.argv[1]), {})\n"
            "except ConfigError as error:\n    print(error)\n"
        )
        read = subprocess.run(
            [*AS_SERVICE_UID, sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd="/",
        )
    assert read.stdout.startswith("targets.leads.path: cannot create the folder "), read
    assert f"{root / 'srv'} is not writable" in read.stdout
