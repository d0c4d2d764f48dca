"""The `file` target: one JSON line per delivery, fsynced, for audit and trying relay out."""

from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from relay.config.files import folder_problem
from relay.config.reader import ConfigError, Section
from relay.core.outcome import Outcome
from relay.kinds.base import TargetKind
from relay.kinds.target import Envelope, Target
from relay.targets.base import envelope_event

if TYPE_CHECKING:
    from relay.core.secrets import Masker


@dataclass(frozen=True)
class FileSettings:
    path: Path


def parse(section: Section, base: Path) -> FileSettings:
    settings = FileSettings(path=section.path("path", base))
    if problem := folder_problem(settings.path):
        raise ConfigError(section.key("path"), problem)
    return settings


def build(name: str, settings: FileSettings, concurrency: int) -> Target:
    return FileTarget(name, settings.path)


def destination(settings: FileSettings, masker: Masker) -> str:
    return str(settings.path)


def view(settings: FileSettings, masker: Masker) -> dict[str, Any]:
    return {"path": str(settings.path)}


class FileTarget:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self._path = path
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        pass

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return f"append to {self._path}:\n" + orjson.dumps(_record(envelope)).decode()

    async def send(self, envelope: Envelope) -> Outcome:
        line = orjson.dumps(_record(envelope)) + b"\n"
        if envelope.paced is not None:
            await envelope.paced()
        try:
            async with self._lock:
                await asyncio.to_thread(self._append, line)
        except OSError as error:
            return Outcome.retry(f"cannot write {self._path.name}: {error.strerror or error}")
        return Outcome.success()

    def _append(self, line: bytes) -> None:
        # O_APPEND writes of one line land whole even if another process appends too.
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def _record(envelope: Envelope) -> dict[str, Any]:
    event = envelope_event(envelope)
    record: dict[str, Any] = {
        "event_id": event.pop("id"),
        "delivery_id": str(envelope.delivery.id),
        "attempt": envelope.attempt,
        **event,
        "content_type": envelope.payload.content_type,
    }
    try:
        record["body"] = envelope.payload.body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(envelope.payload.body).decode("ascii")
    return record


KIND = TargetKind(name="file", parse=parse, build=build, destination=destination, view=view)
