"""One writer per training workdir: an exclusive lock held for the whole run.

The lock is an flock on WORKDIR/writer.lock, so the kernel releases it when its process
ends in any way (kill -9 included): a stale lock from a killed run is never in the way and
needs no clean-up. The file records who holds it (pid, host, start time) for the message a
second writer gets. Readers (experiments.evaluate) never take it: they write nothing there.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import socket
import time

NAME = "writer.lock"


class WorkdirBusy(ValueError):
    """The workdir is being written by another process (the message names it)."""


def acquire(workdir: str | os.PathLike):
    """Takes WORKDIR's writer lock and returns its open file (close it to release); raises
    WorkdirBusy naming the holder when another live process has it."""
    workdir = pathlib.Path(workdir)
    path = workdir / NAME
    f = open(path, "a+")  # noqa: SIM115 - held open for the run: closing releases the lock
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder(f.read())
        f.close()
        raise WorkdirBusy(
            f"--workdir={workdir} is being trained by another process ({holder}; its lock "
            f"is {path}). Wait for it to finish or stop it (its checkpoints resume), or "
            "give another --workdir. Reading it (experiments.evaluate) is safe meanwhile."
        ) from None
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
    f.flush()
    return f


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return "a process that has not yet written its pid"
