"""A run's metrics: rows appended to WORKDIR/metrics.jsonl and TensorBoard event files.

The leader process writes; every process keeps the rows (for the final plots). On resume,
rows of steps past the restored checkpoint are dropped, since those steps are redone: from
metrics.jsonl (rewritten atomically; a last line torn by a kill is one of them) and from
TensorBoard (its events rewritten from the kept rows), so neither shows a step twice.
"""

from __future__ import annotations

import json
import pathlib
import shutil

from kjax import files


class MetricsWriter:
    """Rows {"step": int, name: number, ...} of one run, in `workdir`."""

    def __init__(self, workdir: pathlib.Path, *, write: bool):
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self.tb_dir = pathlib.Path(workdir) / "tensorboard"
        self.write_files = write
        self.records: list[dict] = []
        self._tb = self._open_tb() if write else None

    def _open_tb(self):
        try:  # tensorboardX is optional
            from tensorboardX import SummaryWriter
        except ImportError:
            return None
        return SummaryWriter(str(self.tb_dir))

    def resume(self, step: int) -> None:
        """Keeps the rows of steps <= `step` (the checkpoint's) and drops the rest, on disk
        too: metrics.jsonl is rewritten atomically and TensorBoard's events from the rows."""
        self.records = [r for r in files.read_jsonl(self.path) if r["step"] <= step]
        if not self.write_files:
            return
        files.write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
        if self._tb is not None:
            self._tb.close()
            shutil.rmtree(self.tb_dir, ignore_errors=True)
            self._tb = self._open_tb()
            for row in self.records:
                self._scalars(row)
            self._tb.flush()

    def _scalars(self, row: dict) -> None:
        for name, value in row.items():
            if name != "step" and isinstance(value, int | float):
                self._tb.add_scalar(name, value, row["step"])

    def write(self, row: dict) -> None:
        self.records.append(row)
        if not self.write_files:
            return
        files.append_line(self.path, json.dumps(row))
        if self._tb is not None:
            self._scalars(row)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
