"""Crash-safe small files: whole-file writes that a kill cannot tear (results, reports,
identities), and JSON lines read back with a torn last line (a kill mid-append) left out."""

from __future__ import annotations

import io
import json
import os
import pathlib


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Writes `data` (text, or bytes such as a PNG) to `path` so that a crash leaves the old
    file or the new one, never a torn one: a temporary file beside it, fsync, rename over
    it, then fsync the folder, without which a power loss can forget the rename itself."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_figure(fig, path: str | os.PathLike, dpi: int) -> None:
    """A matplotlib figure saved as PNG through write_atomic (savefig writes in place)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_atomic(path, buf.getvalue())


def _fsync_dir(folder: pathlib.Path) -> None:
    """fsync a folder's entry table (POSIX; Windows cannot open a folder, and there the
    rename is as durable as the platform makes it)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Appends one line in one write, on disk before returning (a kill tears at most it)."""
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSON-lines file that is appended to (none if it is absent). A torn
    last line (a process killed while appending it) is left out; a bad line before it is
    an error naming the file, the line and the fix."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break  # the torn tail of a kill
            raise ValueError(
                f"{path}: line {i + 1} is not JSON ({e}); delete that line (or restore the "
                "file) and rerun."
            ) from None
    return rows
