"""`type = "file"`: one JSON line per delivery, appended to a file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay.config.files import folder_problem
from relay.config.reader import ConfigError, Section
from relay.kinds.base import TargetKind

if TYPE_CHECKING:
    from relay.secrets import Masker
    from relay.targets.base import Target


@dataclass(frozen=True)
class FileSettings:
    path: Path


def parse(section: Section, base: Path) -> FileSettings:
    settings = FileSettings(path=section.path("path", base))
    if problem := folder_problem(settings.path):
        raise ConfigError(section.key("path"), problem)
    return settings


def build(name: str, settings: FileSettings, concurrency: int) -> Target:
    from relay.targets.file import FileTarget

    return FileTarget(name, settings.path)


def describe(settings: FileSettings, masker: Masker) -> str:
    return str(settings.path)


def view(settings: FileSettings, masker: Masker) -> dict[str, Any]:
    return {"path": str(settings.path)}


KIND = TargetKind(name="file", parse=parse, build=build, describe=describe, view=view)
