"""Tasks the trainer can train and evaluate on, one module each; the registry is the list
of modules.

A task module holds its typed config (`Config`, a frozen TaskConfig subclass whose `kind`
names the task), its dataset preparation, prompts and SFT targets for the tiny character
model and for pretrained models, and its verifier (docs/tasks.md walks through one). The
config is chosen on the command line by `--config.task.kind=NAME`; NAME is a built-in
kind or the dotted path of a module outside kjax (`mypkg.tasks.toy`), imported on first
use. Adding a built-in task is one module plus one entry in BUILTIN.

Importing this package loads only the config classes: each module imports its data,
reward and model code inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

from kjax.tasks import arith, code, countdown, humaneval, livebench, math
from kjax.tasks.base import TaskConfig

BUILTIN = (arith, math, countdown, code, humaneval, livebench)
_REQUIRED = ("Config", "load", "tiny_tokenizer")
_REGISTRY: dict[str, types.ModuleType] = {}


def register(module: types.ModuleType) -> types.ModuleType:
    """Adds a task module (it must define Config, load and tiny_tokenizer); returns it."""
    missing = [name for name in _REQUIRED if not hasattr(module, name)]
    if missing:
        raise ValueError(
            f"task module {module.__name__} lacks {', '.join(missing)}; a task module defines "
            "Config (a TaskConfig subclass), load(cfg, tokenizer, data_dir, eval_problems) "
            "and tiny_tokenizer(cfg) (docs/tasks.md)."
        )
    cls = module.Config
    if not (isinstance(cls, type) and issubclass(cls, TaskConfig)) or not cls.kind:
        raise ValueError(
            f"{module.__name__}.Config must subclass kjax.tasks.base.TaskConfig and set its "
            "`kind` default (the name the command line uses)."
        )
    known = _REGISTRY.get(cls.kind)
    if known is not None and known is not module:
        raise ValueError(f"task kind {cls.kind!r} is taken by {known.__name__}; rename one.")
    _REGISTRY[cls.kind] = module
    return module


for _module in BUILTIN:
    register(_module)


def kinds() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def module_of(kind: str) -> types.ModuleType:
    """The task module of a kind: a registered name or an importable dotted module path."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"`config.task.kind` must be a task name; got {kind!r}.")
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if "." not in kind:
        raise ValueError(
            f"`config.task.kind` {kind!r} is unknown; known: {', '.join(kinds())}, or the "
            "dotted path of a task module (docs/tasks.md)."
        )
    try:
        module = importlib.import_module(kind)
    except ImportError as e:
        raise ValueError(
            f"`config.task.kind` {kind!r}: cannot import the task module ({e}); check the "
            "path and that its package is installed."
        ) from None
    except Exception as e:  # the module itself fails: a syntax error, a raise at import
        raise ValueError(
            f"`config.task.kind` {kind!r}: the task module failed while importing "
            f"({type(e).__name__}); fix it and rerun. Its traceback:\n{_user_traceback(e)}"
        ) from None
    register(module)
    _REGISTRY.setdefault(kind, module)  # reachable by its path as well as its kind
    return module


def _user_traceback(e: BaseException) -> str:
    """e's traceback without the import machinery's frames: the user's own code only."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if "importlib" not in f.filename and f.filename != __file__]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(e), e)
    return "".join(lines).rstrip()


def config_class(kind: str) -> type[TaskConfig]:
    return module_of(kind).Config


def config_from_json(data: dict) -> TaskConfig:
    """A task config from its to_json form ({"kind": ..., fields...})."""
    data = dict(data)
    if "kind" not in data:
        raise ValueError(f"a task config needs its kind (one of {', '.join(kinds())}); got {data}.")
    cls = config_class(data.pop("kind"))
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = {k: v for k, v in data.items() if k not in fields}
    if any(unknown.values()):  # falsy ones are fields an older single TaskConfig had
        raise ValueError(
            f"task config of kind {cls.kind!r} has no field(s) {', '.join(sorted(unknown))}."
        )
    return cls(**{k: v for k, v in data.items() if k in fields})


def load(cfg: TaskConfig, tokenizer, data_dir, eval_problems: int):
    """The Task of cfg (tokenizer None: the tiny model, whose characters the task picks)."""
    module = module_of(cfg.kind)
    if tokenizer is None:
        tokenizer = module.tiny_tokenizer(cfg)
    return module.load(cfg, tokenizer, data_dir, eval_problems)


__all__ = [
    "BUILTIN",
    "TaskConfig",
    "config_class",
    "config_from_json",
    "kinds",
    "load",
    "module_of",
    "register",
]
