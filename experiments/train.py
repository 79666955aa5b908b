"""RL training from the command line (resumes when rerun with the same workdir).

  python -m experiments.train --config=experiments/configs/tiny_arith.py:passk \\
      --workdir=/tmp/run [--config.steps=50 --config.objective.k=4 ...]

The config is validated before any compute; a bad value exits with status 2 and a
message naming the field.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

from kjax.rl.config import TrainConfig, override


def load_config(spec: str) -> TrainConfig:
    """FILE.py:PRESET -> the TrainConfig that FILE's get_config(PRESET) returns."""
    path, _, preset = spec.partition(":")
    if not pathlib.Path(path).is_file():
        raise ValueError(f"--config: no such file {path!r} (expected FILE.py:PRESET).")
    module_spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # a syntax error, a failing import: not a usable config file
        raise ValueError(f"--config: {path} failed to load ({type(e).__name__}: {e}).") from None
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(
            f"--config: {path} is not a config file (it defines no get_config(preset)); "
            "pass one of experiments/configs/*.py:PRESET."
        )
    presets = getattr(module, "PRESETS", {})
    if preset and preset not in presets:
        raise ValueError(f"--config: {path} has no preset {preset!r}; presets: {sorted(presets)}.")
    cfg = module.get_config(preset) if preset else module.get_config()
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"--config: {spec} did not return a TrainConfig.")
    return cfg


def parse(argv: list[str]) -> tuple[TrainConfig, str]:
    """(validated-for-types config, workdir) from command-line arguments."""
    parser = argparse.ArgumentParser(prog="experiments.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="FILE.py:PRESET")
    parser.add_argument("--workdir", required=True)
    args, rest = parser.parse_known_args(argv)
    cfg = load_config(args.config)
    items = {}
    for item in rest:
        if not item.startswith("--config.") or "=" not in item:
            raise ValueError(f"unknown argument {item!r}; overrides look like --config.x.y=value.")
        path, _, value = item[len("--config.") :].partition("=")
        items[path] = value
    return override(cfg, items), args.workdir


def os_error(e: OSError, workdir: str) -> str:
    """The message of a file the run could not read or write (no traceback)."""
    if e.filename is None:
        return str(e)
    name = pathlib.Path(e.filename).absolute()
    if name.is_relative_to(pathlib.Path(workdir).absolute()):
        return (
            f"--workdir={workdir}: cannot write {e.filename} ({e.strerror}); give a --workdir "
            "that is a folder this user can write (not read-only, not under a file)."
        )
    return f"cannot use {e.filename} ({e.strerror}); check that path."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, workdir = parse(argv)
        from kjax.rl import multihost

        multihost.maybe_initialize_distributed()
        cfg = _slice_layout(cfg, argv, multihost.device_count())
        cfg.validate(multihost.device_count())
    except ValueError as e:
        print(f"experiments.train: error: {e}", file=sys.stderr)
        return 2
    import logging

    from kjax import disk

    quiet = disk.QuietDiskFull()
    # orbax's save threads log each failed write with its traceback (absl's logger, which
    # the root logger's handlers print): a full disk is said once, at the end.
    targets = [logging.getLogger("absl"), *logging.getLogger().handlers]
    for target in targets:
        target.addFilter(quiet)
    hook, sys.excepthook = sys.excepthook, disk.quiet_excepthook(sys.excepthook)
    try:
        return _train(cfg, workdir)
    finally:
        sys.excepthook = hook
        for target in targets:
            target.removeFilter(quiet)


def _slice_layout(cfg: TrainConfig, argv: list[str], devices: int) -> TrainConfig:
    """cfg with its preset's layout for these devices (experiments/slices.py:
    SLICE_LAYOUTS, by chip kind and count) unless the command line sets a mesh or
    microbatches; said on stdout when it applies."""
    import jax

    from experiments import slices

    spec = argparse.ArgumentParser(add_help=False)
    spec.add_argument("--config")
    kind = slices.chip_kind(jax.devices()[0].device_kind)
    cfg, layout = slices.for_slice(cfg, spec.parse_known_args(argv)[0].config, kind, devices, argv)
    if layout is not None:
        m, micro = layout
        sizes = f"data={m.data} fsdp={m.fsdp} tensor={m.tensor}"
        print(f"experiments.train: the preset's layout for {devices} x {kind}: {sizes} x {micro}")
    return cfg


def _train(cfg, workdir: str) -> int:
    """train_and_evaluate with a user's errors as messages (exit 2, 3 for a NaN stop)."""
    from kjax import disk
    from kjax.rl.loop import train_and_evaluate

    try:
        final = train_and_evaluate(cfg, workdir)
    except Exception as e:
        if disk.is_disk_full(e):  # in whatever words the writing library raised it
            print(f"experiments.train: error: {disk.message(workdir, e)}", file=sys.stderr)
            return 2
        if isinstance(e, ValueError | FloatingPointError):  # identity, data, NaN stop
            print(f"experiments.train: error: {e}", file=sys.stderr)
            return 3 if isinstance(e, FloatingPointError) else 2
        if isinstance(e, OSError):  # a workdir that cannot be written, a missing file
            print(f"experiments.train: error: {os_error(e, workdir)}", file=sys.stderr)
            return 2
        raise
    from kjax.evaluation import k_values

    ks = [k for k in k_values(cfg.eval.n_eval) if f"eval/pass@{k}" in final]
    print(" ".join(f"pass@{k}={final[f'eval/pass@{k}']:.3f}" for k in ks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
