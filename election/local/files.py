"""Small local files written whole or not at all (identity, sidecars, cookies, session files).

A crash must leave either the old file or the new one, never half of either:
the document goes to a temporary file next to the target, is fsynced, renamed
over the target, and the directory is fsynced so the rename itself survives.

Example::

    write_json_atomically(Path("data/.broker.meta"), {"broker_id": 3})
    write_json_atomically(Path("/run/session.json"), doc, mode=0o600)   # secrets: owner only
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Suffix of the temporary file; a leftover one is never read as the real file.
TEMP_SUFFIX = ".writing"


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename (or create) inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(
    path: str | os.PathLike,
    doc: dict,
    *,
    mode: int = 0o666,
    sort_keys: bool = False,
    indent: int | None = None,
) -> None:
    """Write `doc` to `path` so that a crash leaves either the old or the new file whole.

    ``mode`` is the permission of the new file (before the umask); ``sort_keys`` and
    ``indent`` are passed to :func:`json.dumps`, so each caller keeps its file's format.
    """
    path = Path(path)
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    data = json.dumps(doc, sort_keys=sort_keys, indent=indent).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
