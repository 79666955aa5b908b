"""Training progress that suits both a terminal and a log file.

On a terminal: a tqdm bar (one line, redrawn). Redirected to a file or a pipe, a redrawn bar
becomes thousands of carriage-return fragments on one line, so there it prints a plain line
every `every` steps (and at the last one): step, rate, time left and the shown metrics.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class LineProgress:
    """tqdm's subset the loops use (update, set_postfix, close), as periodic lines."""

    def __init__(self, total: int, initial: int, desc: str, file: TextIO, every: int):
        self.total, self.n, self.desc, self.file = total, initial, desc, file
        self.every = max(1, every)
        self.start, self.start_n = time.monotonic(), initial
        self.postfix: dict[str, str] = {}
        self.due = False

    def update(self, n: int = 1) -> None:
        self._flush()
        self.n += n
        self.due = self.n % self.every == 0 or self.n >= self.total

    def set_postfix(self, **postfix) -> None:
        # The loops update, then set the step's metrics: the line waits for them.
        self.postfix = {k: str(v) for k, v in postfix.items()}
        self._flush()

    def _flush(self) -> None:
        if self.due:
            self.due = False
            self._line()

    def _line(self) -> None:
        elapsed = time.monotonic() - self.start
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else float("nan")
        left = (self.total - self.n) / rate if rate > 0 else float("nan")
        shown = " ".join(f"{k}={v}" for k, v in self.postfix.items())
        print(
            f"{self.desc}: step {self.n}/{self.total} ({rate:.2f} steps/s, {left:.0f} s left)"
            + (f" {shown}" if shown else ""),
            file=self.file,
            flush=True,
        )

    def close(self) -> None:
        self._flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Off(LineProgress):
    def __init__(self):
        super().__init__(0, 0, "", sys.stderr, 1)

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **postfix) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, initial: int = 0, desc: str = "", *, enabled: bool = True, file=None):
    """A progress reporter for `total` steps starting at `initial`: a tqdm bar on a terminal,
    a line every ~5% of the run (at least every step) when `file` (stderr) is not one."""
    file = sys.stderr if file is None else file
    if not enabled:
        return _Off()
    if getattr(file, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, file=file)
    return LineProgress(total, initial, desc, file, every=max(1, total // 20))
