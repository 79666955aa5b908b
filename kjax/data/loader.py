"""Prepare a builder offline (array_record) and read it back by random access: a seeded
permutation per epoch, sharded by host, in fixed-size batches with a resumable position."""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds


def prepare(
    builder_cls: type[tfds.core.GeneratorBasedBuilder],
    data_dir: str | Path,
    *,
    config: tfds.core.BuilderConfig | str | None = None,
    manual_dir: str | Path | None = None,
    needs: tuple[str, ...] = (),
) -> tfds.core.DatasetBuilder:
    """Prepares (once) and returns the builder. Writes array_record; needs no network.

    A failure (e.g. a malformed row) leaves no dataset behind: TFDS writes into an
    `incomplete.*` directory and only renames it into place on success. `needs`: the
    splits the caller reads; a builder of local files (`missing_files`) is checked for
    them before anything is prepared, so a missing file is never cached as a missing split.
    """
    tfds.display_progress_bar(False)
    kwargs = {} if config is None else {"config": config}
    builder = builder_cls(data_dir=str(data_dir), file_format="array_record", **kwargs)
    missing_files = getattr(builder, "missing_files", None)
    if needs and missing_files is not None and not builder.is_prepared():
        missing = missing_files(manual_dir, needs)
        if missing:
            raise ValueError(
                f"task.manual_dir={manual_dir}: no {' and no '.join(missing)}; this task reads "
                f"the {' and '.join(needs)} splits from there (BUILD.md says where the files "
                "come from). Put them there and rerun; nothing was prepared."
            )
    download = tfds.download.DownloadConfig(
        manual_dir=None if manual_dir is None else str(manual_dir)
    )
    try:
        builder.download_and_prepare(download_config=download)
    except Exception as e:  # tfds' writers say a full disk in their own words
        from kjax import disk

        if disk.is_disk_full(e):
            raise OSError(errno.ENOSPC, "No space left on device", str(data_dir)) from e
        raise
    lacking = [s for s in needs if s not in builder.info.splits]
    if lacking:  # prepared by an older kjax from a folder without the file
        raise ValueError(
            f"the dataset prepared in {builder.data_dir} has no {' or '.join(lacking)} "
            f"split; delete {builder.data_dir} and rerun (it is prepared again from "
            f"task.manual_dir={manual_dir})."
        )
    return builder


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8")
    return x.item() if isinstance(x, np.generic) else x


def decode(example: dict[str, Any]) -> dict[str, Any]:
    """TFDS returns text as bytes and sequences as arrays; kjax wants str, int and lists."""
    return {
        k: [_plain(x) for x in v] if isinstance(v, np.ndarray | list) else _plain(v)
        for k, v in example.items()
    }


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """batch_size is per host. Every host sees the same number of batches per epoch."""

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    shard_index: int = 0  # this host (jax.process_index())
    shard_count: int = 1  # all hosts (jax.process_count())

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"LoaderConfig.batch_size must be >= 1; got {self.batch_size}.")
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(
                f"shard_index must be in [0, shard_count); got {self.shard_index} "
                f"of {self.shard_count}."
            )


@dataclasses.dataclass(frozen=True)
class Position:
    """Where an iterator stands; save it with a checkpoint to resume exactly."""

    epoch: int = 0
    batch: int = 0


def epoch_indices(size: int, epoch: int, config: LoaderConfig) -> np.ndarray:
    """This host's record indices for one epoch, [num_batches * batch_size].

    The permutation depends only on (seed, epoch); host h takes every shard_count-th
    index starting at h, cut so all hosts get the same number of whole batches.
    """
    order = (
        np.random.default_rng([config.seed, epoch]).permutation(size)
        if config.shuffle
        else np.arange(size)
    )
    mine = order[config.shard_index :: config.shard_count]
    per_host = (size // config.shard_count) // config.batch_size * config.batch_size
    return mine[:per_host]


def batches(
    source: Sequence[dict],
    config: LoaderConfig,
    start: Position = Position(),
    num_epochs: int | None = 1,
) -> Iterator[tuple[Position, list[dict]]]:
    """Yields (position after this batch, [batch_size] decoded examples).

    source: a TFDS data source (random access, len()); num_epochs=None loops forever.
    """
    if len(source) // config.shard_count < config.batch_size:
        raise ValueError(
            f"{len(source)} examples over {config.shard_count} hosts cannot fill "
            f"one batch of {config.batch_size}; lower batch_size."
        )
    epoch, batch = start.epoch, start.batch
    while num_epochs is None or epoch < num_epochs:
        idx = epoch_indices(len(source), epoch, config).reshape(-1, config.batch_size)
        for b in range(batch, len(idx)):
            examples = [decode(source[int(i)]) for i in idx[b]]
            nxt = Position(epoch, b + 1) if b + 1 < len(idx) else Position(epoch + 1, 0)
            yield nxt, examples
        epoch, batch = epoch + 1, 0
