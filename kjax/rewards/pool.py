"""A process pool for verifiers with a per-item timeout: a hung or crashing item is
killed with its worker, gets a default result, and the rest of the batch goes on."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from kjax.rewards import sandbox

T = TypeVar("T")
R = TypeVar("R")

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    workers: int = max(1, os.cpu_count() or 1)
    item_timeout_s: float = 60.0  # per item, on top of any limit inside the item
    # Extra time for a fresh worker's first item: interpreter start and imports (sympy).
    startup_timeout_s: float = 60.0

    def __post_init__(self):
        if self.workers < 1 or self.item_timeout_s <= 0 or self.startup_timeout_s < 0:
            raise ValueError(
                "PoolConfig needs workers >= 1, item_timeout_s > 0 and startup_timeout_s >= 0; "
                f"got {self.workers}, {self.item_timeout_s}, {self.startup_timeout_s}."
            )


def _on_term(signum, frame):  # the pool gave up on this worker's item
    sandbox.kill_active()
    os._exit(1)


def _worker(conn: Connection) -> None:
    signal.signal(signal.SIGTERM, _on_term)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, item = task
        try:
            conn.send((True, fn(item)))
        except Exception as e:  # noqa: BLE001 - re-raised in the parent with its type
            conn.send((False, e))


class _Slot:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.deadline = 0.0
        self.fresh = True

    def stop(self, grace_s: float = 1.0) -> None:
        self.proc.terminate()  # SIGTERM: the worker kills its sandboxes first
        self.proc.join(grace_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class VerifierPool:
    """`with VerifierPool(cfg) as pool: pool.map(fn, items, default=...)`.

    fn must be picklable (a module-level function or a functools.partial of one).
    """

    def __init__(self, config: PoolConfig = PoolConfig()):
        self.config = config
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a threaded JAX host
        self._slots: list[_Slot] = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            slot.stop(grace_s=2.0)
        self._slots = []

    def map(self, fn: Callable[[T], R], items: Sequence[T], *, default: R) -> list[R]:
        """Applies fn to every item in parallel; an item that times out or kills its worker
        gets `default` (logged). An exception raised by fn is re-raised here."""
        results: list[Any] = [default] * len(items)
        todo = list(range(len(items)))[::-1]
        while len(self._slots) < min(self.config.workers, len(items)):
            self._slots.append(_Slot(self._ctx))
        busy: dict[Connection, _Slot] = {}
        while todo or busy:
            for slot in self._slots:
                if todo and slot.index is None:
                    slot.index = todo.pop()
                    grace = self.config.startup_timeout_s if slot.fresh else 0.0
                    slot.deadline = time.monotonic() + self.config.item_timeout_s + grace
                    slot.conn.send((fn, items[slot.index]))
                    busy[slot.conn] = slot
            timeout = max(0.0, min(s.deadline for s in busy.values()) - time.monotonic())
            ready = wait(list(busy), timeout=timeout)
            for conn in ready:
                slot = busy.pop(conn)
                try:
                    ok, value = conn.recv()
                except (EOFError, OSError):
                    _log.warning(
                        "verifier item %d crashed its worker; scored as default", slot.index
                    )
                    self._replace(slot)
                    continue
                if not ok:
                    self.close()  # drop in-flight items so no stale result reaches a later map
                    raise value
                results[slot.index], slot.index, slot.fresh = value, None, False
            now = time.monotonic()
            for conn, slot in list(busy.items()):
                if conn not in ready and now >= slot.deadline:
                    _log.warning(
                        "verifier item %d timed out after %.1fs; scored as default",
                        slot.index,
                        self.config.item_timeout_s,
                    )
                    del busy[conn]
                    self._replace(slot)
        return results

    def _replace(self, slot: _Slot) -> None:
        slot.stop()
        self._slots[self._slots.index(slot)] = _Slot(self._ctx)
