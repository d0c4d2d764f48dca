"""`--json` output reaches a pipe whole, however the stream takes it.

Under PYTHONUNBUFFERED=1 (set in CI here and in many service environments)
`sys.stdout.buffer` is a raw FileIO whose write() is one system call; into a
pipe it took 131,072 of 1,163,679 bytes of `relay events --json` once in a
few runs, and the rest was silently dropped (seen in the kill-9 chaos test).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from relay.cli.common import emit

EXAMPLE = Path(__file__).resolve().parents[2] / "relay.example.toml"


class ShortWriter(io.RawIOBase):
    """A raw stream like a pipe's FileIO: each write takes at most `chunk` bytes."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.received = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        taken = bytes(data[: self.chunk])
        self.received += taken
        return len(taken)


class Stdout(io.StringIO):
    def __init__(self, buffer: ShortWriter) -> None:
        super().__init__()
        self._raw = buffer

    @property
    def buffer(self) -> ShortWriter:  # type: ignore[override]
        return self._raw


def test_json_output_is_written_whole_through_short_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = ShortWriter(chunk=65_536)
    monkeypatch.setattr(sys, "stdout", Stdout(raw))
    data = [{"id": str(n), "body": "x" * 100} for n in range(5_000)]
    emit(argparse.Namespace(json=True), data, lambda _: "")
    assert orjson.loads(bytes(raw.received)) == data


def test_a_reader_that_closed_the_pipe_gets_no_error_line(tmp_path: Path) -> None:
    # `relay check | head -1` printed "relay: Broken pipe" on stderr.
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before relay writes a line
    try:
        result = subprocess.run(
            [sys.executable, "-m", "relay", "check", "--config", str(EXAMPLE)],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141
