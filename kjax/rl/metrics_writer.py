"""A run's metrics: rows appended to WORKDIR/metrics.jsonl and TensorBoard event files.

The leader process writes; every process keeps the rows (for the final plots). On resume,
rows of steps past the restored checkpoint are dropped, since those steps are redone.
"""

from __future__ import annotations

import json
import pathlib

from kjax import evaluation


class MetricsWriter:
    """Rows {"step": int, name: number, ...} of one run, in `workdir`."""

    def __init__(self, workdir: pathlib.Path, *, write: bool):
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self.write_files = write
        self.records: list[dict] = []
        self._tb = None
        if write:
            try:  # tensorboardX is optional
                from tensorboardX import SummaryWriter
            except ImportError:
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

    def resume(self, step: int) -> None:
        """Keeps the rows of steps <= `step` (the checkpoint's) and drops the rest, on disk too."""
        self.records = [r for r in evaluation.read_jsonl(self.path) if r["step"] <= step]
        if self.write_files:
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def write(self, row: dict) -> None:
        self.records.append(row)
        if not self.write_files:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for name, value in row.items():
                if name != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(name, value, row["step"])
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
