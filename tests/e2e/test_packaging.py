"""The single-file build runs relay with nothing but a Python interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# A minute of CPU or more for the build alone: not in the README's test command.
pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


def bare_python() -> str:
    """An interpreter without this venv's packages: Debian's, else the base one."""
    if Path("/usr/bin/python3").exists():
        return "/usr/bin/python3"
    return str(Path(sys.base_prefix) / "bin" / "python3")


def test_single_file_build_runs_help_and_check(tmp_path: Path) -> None:
    output = tmp_path / "relay.pyz"
    # Pure Python here, to keep the default run quick: the compiled file (the
    # script's default) is built and run as a service by the deploy suite,
    # which follows docs/deploy.md.
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RELAY_MYPYC": "0",
    }
    subprocess.run(
        [str(ROOT / "scripts" / "build-single-file"), str(output)],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert output.stat().st_size > 1_000_000
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHIV_ROOT": str(tmp_path / "shiv")}
    shutil.copy(ROOT / "relay.example.toml", tmp_path / "relay.toml")
    helped = subprocess.run(
        [bare_python(), "-I", str(output), "--help"],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "usage: relay" in helped.stdout
    checked = subprocess.run(
        [bare_python(), "-I", str(output), "check", "--config", str(tmp_path / "relay.toml")],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "config OK" in checked.stdout
    assert "15 retries, 2s … 9h06m, cycle 18h12m" in checked.stdout


def test_single_file_build_without_a_compiler_says_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "CC": "no-such-compiler"}
    env.pop("RELAY_MYPYC", None)
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-single-file"), str(tmp_path / "relay.pyz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert built.returncode == 1
    assert built.stderr.count("\n") == 1, built.stderr
    assert "apt install gcc python3-dev" in built.stderr
    assert "RELAY_MYPYC=0" in built.stderr
    assert not (tmp_path / "relay.pyz").exists()
