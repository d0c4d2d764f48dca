"""`--json` output reaches a pipe whole, however the stream takes it.

Under PYTHONUNBUFFERED=1 (set in CI here and in many service environments)
`sys.stdout.buffer` is a raw FileIO whose write() is one system call; into a
pipe it took 131,072 of 1,163,679 bytes of `relay events --json` once in a
few runs, and the rest was silently dropped (seen in the kill-9 chaos test).
"""

from __future__ import annotations

import argparse
import io
import sys

import orjson
import pytest

from relay.cli.common import emit


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
