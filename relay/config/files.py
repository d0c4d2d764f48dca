"""Files a config names that must be usable when it is applied: checked while the
file is read, so `relay check` and a reload refuse them with one line instead of
failing half-way through starting the new config."""

from __future__ import annotations

import os
import secrets
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
        if ancestor != folder and not os.access(ancestor, os.W_OK | os.X_OK):
            # Read-only (the unit's ProtectSystem=strict) or another user's: the
            # mkdir would fail when the target starts, in the middle of a reload.
            return (
                f"cannot create the folder {folder}: {ancestor} is not writable by this"
                " user (under the systemd unit only /var/lib/relay is)"
            )
    except OSError as error:
        return f"cannot create the folder {folder}: {error.strerror or error}"
    return None


def ca_file_problem(path: Path) -> str | None:
    """Why `path` cannot serve as a bundle of CA certificates, or None."""
    try:
        ssl.create_default_context(cafile=str(path))
    except FileNotFoundError:
        return f"{path}: no such file"
    except ssl.SSLError as error:  # an OSError too: before it
        return f"{path}: not a PEM file of CA certificates ({error.reason or error})"
    except OSError as error:
        return f"{path}: cannot read: {error.strerror or error}"
    return None


def read_token_file(path: Path) -> str | None:
    """The token kept in `path`, or None while the file does not exist yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{path}: expected one token on one line")
    return token


def write_token_file(path: Path) -> str:
    """A new random token in `path` (mode 0600), or the one another process just wrote."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        found = read_token_file(path)
        if found is None:
            raise ValueError(f"{path}: vanished while it was being read") from None
        return found
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return token
