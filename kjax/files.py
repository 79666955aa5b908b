"""Crash-safe small files: whole-file writes that a kill cannot tear (results, reports,
identities), and JSON lines read back with a torn last line (a kill mid-append) left out."""

from __future__ import annotations

import json
import os
import pathlib


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` so that a crash leaves the old file or the new one, never a
    torn one: a temporary file beside it, fsync, then rename over it."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
