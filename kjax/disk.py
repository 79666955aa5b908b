"""A full disk, said once: which path, how much space the run needs, and that its data are
safe (checkpoints are complete or absent, metrics.jsonl is cut back on resume, a prepared
dataset is renamed into place only when whole), so the same command resumes once space is
freed. Other libraries report it in their own words (orbax's save threads, tfds' writers)."""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import shutil

_WORDS = "No space left on device"


def is_disk_full(e: BaseException | None) -> bool:
    """Whether e, or an exception it was raised from, is a full disk (ENOSPC)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or _WORDS in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _size(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def message(workdir: str | os.PathLike, e: BaseException) -> str:
    """The one message of a run stopped by a full disk under workdir."""
    workdir = pathlib.Path(workdir)
    where = getattr(e, "filename", None) or workdir
    free = shutil.disk_usage(workdir if workdir.exists() else ".").free
    steps = sorted(
        (p for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if steps:
        need = (
            f"each checkpoint takes {_mb(_size(steps[-1]))} (step {steps[-1].name} is the last "
            "complete one)"
        )
    else:
        need = (
            f"the data prepared so far take {_mb(_size(workdir / 'data'))}"
            if (workdir / "data").exists()
            else "no checkpoint was written yet"
        )
    return (
        f"no space left on the disk of {where} ({_mb(free)} free; {need}). The data are safe: "
        "checkpoints are complete or absent and a half-prepared dataset is never read. Free "
        "space there (or move --workdir) and rerun the same command: it resumes from the last "
        "checkpoint."
    )


class QuietDiskFull(logging.Filter):
    """Drops the log records (tracebacks of orbax's save threads) of a full disk: the
    command says it once at the end."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (is_disk_full(exc) or _WORDS in record.getMessage())


def quiet_excepthook(original):
    """sys.excepthook that drops what a failed asynchronous save prints from its threads
    (tensorstore's callbacks into orbax's closed event loop, a full disk): the command
    says the cause once. Anything else goes to `original`."""

    def hook(kind, value, tb):
        if is_disk_full(value) or (kind is RuntimeError and str(value) == "Event loop is closed"):
            return
        original(kind, value, tb)

    return hook
