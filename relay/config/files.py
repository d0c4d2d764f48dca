"""Files a config names that must be usable when it is applied: checked while the
file is read, so `relay check` and a reload refuse them with one line instead of
failing half-way through starting the new config."""

from __future__ import annotations

import os
import ssl
from pathlib import Path


def folder_problem(path: Path) -> str | None:
    """Why the folder of `path` could not be created, or None when it exists or can be."""
    folder = path.parent
    ancestor = folder
    try:
        if any(len(os.fsencode(part)) > 255 for part in folder.parts):
            return f"cannot create the folder {folder}: a name in it is too long"
        while not ancestor.exists():
            if ancestor.is_symlink():
                return f"cannot create the folder {folder}: {ancestor} is a dangling symlink"
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"cannot create the folder {folder}: {ancestor} is not a folder"
    except OSError as error:
        return f"cannot create the folder {folder}: {error.strerror or error}"
    return None


def ca_file_problem(path: Path) -> str | None:
    """Why `path` cannot serve as a bundle of CA certificates, or None."""
    try:
        ssl.create_default_context(cafile=str(path))
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as error:
        return f"{path}: cannot read: {error.strerror or error}"
    except ssl.SSLError as error:
        return f"{path}: not a PEM file of CA certificates ({error.reason or error})"
    return None
