"""Crash-safe checkpoints of the whole training state (orbax), and workdir identity.

Orbax writes each step into a temporary directory and renames it into place only when
complete, so a process killed mid-write leaves nothing that `latest_step` will pick up:
rerunning the same command resumes from the last complete checkpoint. The state is any
pytree of arrays (params, optimizer state, step, PRNG key data); JSON metadata (data
iterator position, metrics) travels with it atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from kjax.files import write_atomic


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """every: save every this many steps; keep: newest checkpoints kept on disk."""

    every: int = 50
    keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        if self.every < 1:
            raise ValueError(f"checkpoint.every must be >= 1; got {self.every}.")
        if self.keep < 1:
            raise ValueError(f"checkpoint.keep must be >= 1; got {self.keep}.")


class Checkpointer:
    """Saves and restores `(state pytree, meta dict)` under `directory`.

    PRNG keys must be stored as raw key data (`jax.random.key_data(key)`), which is a
    plain uint32 array; rebuild them with `jax.random.wrap_key_data`.
    """

    def __init__(self, directory: str | os.PathLike, config: CheckpointConfig):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=config.keep,
            save_interval_steps=config.every,
            enable_async_checkpointing=config.async_save,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, never read
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._last_saved: int | None = None

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Saves if `step` is on the save interval (or `force`); returns whether it saved.

        Asynchronous: returns once the arrays are copied off the device; the write
        finishes in the background (call `wait` before reading the files).
        """
        if step == self._last_saved:
            return False  # e.g. the final forced save landing on an interval step
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        saved = self._manager.save(step, args=args, force=force)
        if saved:
            self._last_saved = step
        return saved

    def due(self, step: int, *, force: bool = False) -> bool:
        """Whether save(step, ..., force=force) would write a checkpoint."""
        if step == self._last_saved:
            return False
        return force or self._manager.should_save(step)

    def meta(self, step: int | None = None) -> dict:
        """The JSON metadata saved at `step` (default: latest) alone."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return out.meta

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores (state, meta) at `step` (default: latest) shaped and sharded like `like`.

        `like` is a pytree of arrays or jax.ShapeDtypeStruct (with `.sharding` to restore
        straight onto a mesh).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        check_shapes(self.directory / str(step) / "state", abstract, "Resuming")
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        )
        out = self._manager.restore(step, args=args)
        self._last_saved = step
        return out.state, out.meta

    def wait(self) -> None:
        """Blocks until every pending asynchronous save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _steps(directory: pathlib.Path) -> list[int]:
    """The complete checkpoints' steps, oldest first (orbax renames a step's temporary
    folder to its number only once it is written)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def _name(path) -> str:
    """A leaf's path as "train/params/embed", whether its parents are dicts, lists or
    dataclasses (a TrainState's fields are attributes here, dict keys in a checkpoint)."""
    parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    return "/".join(str(p) for p in parts)


def _saved_shapes(state_dir: pathlib.Path) -> dict[str, tuple]:
    """{dotted leaf name: shape} of a checkpoint's saved state (its metadata only)."""
    tree = ocp.PyTreeCheckpointHandler().metadata(state_dir).tree
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
    return {_name(k): tuple(v.shape) for k, v in flat}


def check_shapes(state_dir: pathlib.Path, like: Any, reader: str) -> None:
    """Raises a ValueError naming the checkpoint and the first differing array when the
    saved arrays are not the shapes of `like` (a run of another model's sizes): orbax's
    own message comes from deep inside a restore and names neither."""
    saved = _saved_shapes(state_dir)
    flat = jax.tree_util.tree_flatten_with_path(like)[0]
    for path, leaf in flat:
        name = _name(path)
        if name in saved and saved[name] != tuple(leaf.shape):
            raise ValueError(
                f"{state_dir.parent} holds a model of other sizes than this run's config: "
                f"{name} is {saved[name]} there, {tuple(leaf.shape)} here. {reader} it needs "
                "the config it was trained with; give the run's own config (its "
                "experiment.json), or a new --workdir for the new model."
            )


def read_params(directory: str | os.PathLike, like: Any) -> tuple[Any, int]:
    """(the newest checkpoint's params, its step) restored onto `like`'s shardings
    (ShapeDtypeStructs: any device count, whatever the run saved on), read-only.

    Read-only: no CheckpointManager (it removes temporary folders and old steps of a
    trainer that may be writing beside us) and nothing created. A synchronous run's state
    holds "params"; a lagged one's (rl.policy_lag > 0) holds them under "train". A step
    removed by a live trainer's garbage collection while we read is retried on the newer.
    """
    directory = pathlib.Path(directory)
    for _ in range(3):
        steps = _steps(directory)
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {directory}")
        state_dir = directory / str(steps[-1]) / "state"
        try:
            saved = _saved_shapes(state_dir)
            lagged = any(name.startswith("train/") for name in saved)
            sub = {"train": {"params": like}} if lagged else {"params": like}
            check_shapes(state_dir, sub, "Evaluating")
            args = ocp.args.PyTreeRestore(
                item=sub,
                restore_args=ocp.checkpoint_utils.construct_restore_args(sub),
                partial_restore=True,
            )
            out = ocp.PyTreeCheckpointer().restore(state_dir, args=args)
        except (FileNotFoundError, OSError, ValueError):
            if state_dir.exists():
                raise
            continue  # the trainer removed that step (keep=...) while we read it
        return (out["train"] if lagged else out)["params"], steps[-1]
    raise FileNotFoundError(f"{directory}: every checkpoint was replaced while being read")


def read_meta(directory: str | os.PathLike, step: int) -> dict:
    """The JSON metadata saved beside checkpoint `step`'s state (data position, a LoRA
    run's base fingerprint), read-only; {} where the step has none."""
    path = pathlib.Path(directory) / str(step) / "meta" / "metadata"
    return json.loads(path.read_text()) if path.exists() else {}


def has_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a complete checkpoint (an orbax step folder), read without
    creating anything (a Checkpointer creates its directory)."""
    directory = pathlib.Path(directory)
    return directory.is_dir() and any(p.name.isdigit() and p.is_dir() for p in directory.iterdir())


def _without(identity: dict, keys) -> dict:
    """identity without the dotted `keys` (e.g. "sft.cache_dir")."""
    identity = json.loads(json.dumps(identity))
    for key in keys:
        *parents, last = key.split(".")
        node = identity
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return identity


def ensure_workdir(
    workdir: str | os.PathLike, identity: dict, *, where=(), claim: bool = True
) -> pathlib.Path:
    """Creates `workdir` for the experiment `identity`, or checks it is the same experiment.

    `identity` is the JSON-able config that defines the run. Resuming a workdir that holds
    a different experiment would silently mix two runs, so it raises a ValueError naming
    the differing fields instead. `where`: dotted keys of identity that say where files
    are, not what the experiment is (a cache folder, spelled relative or absolute, moved
    with the workdir): recorded, never compared. claim=False only checks: a run checks its
    workdir first and claims it once everything is built, so a run that fails before it
    starts (bad data, a config error found late) leaves the workdir free for the fix.
    """
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "experiment.json"
    identity = json.loads(json.dumps(identity, default=str))  # normalise tuples, enums
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path} is not readable JSON ({e}); it names the experiment this workdir "
                "holds: delete it to claim the workdir again, or use a new --workdir."
            ) from None
        if _without(stored, where) != _without(identity, where):
            stored, mine = _without(stored, where), _without(identity, where)
            keys = sorted(set(stored) | set(mine))
            diff = [k for k in keys if stored.get(k) != mine.get(k)]
            raise ValueError(
                f"workdir {workdir} holds a different experiment (fields differ: "
                f"{', '.join(diff)}). Use a new --workdir, or rerun with the original config."
            )
        return workdir
    if claim:  # atomic: a crash never leaves a half-written identity
        write_atomic(path, json.dumps(identity, indent=2, sort_keys=True))
    return workdir
