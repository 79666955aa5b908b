"""A run's config from and to text: `--config.a.b=value` overrides and the JSON identity.

Works on any config dataclass of kjax/rl/config.py (which re-exports `override` and
`to_json`); it knows the groups only by their field types.
"""

from __future__ import annotations

import ast
import dataclasses
import enum

from kjax import tasks
from kjax._fields import IDENTITY_IF_SET, coerce_enum
from kjax.data.synthetic import Operator
from kjax.rl.objective_config import KSchedule
from kjax.tasks.arith import operators as _operators
from kjax.tasks.base import TaskConfig

__all__ = ["override", "to_json"]


def override(cfg, items: dict[str, str], _prefix: str = ""):
    """cfg with fields set from strings: {"rl.epochs": "2", "objective.k": "4"}.

    Values parse by the current value's type (enums by name or value, bools as
    true/false, operator tuples as "add,sub" or "+,-"). `task.kind=NAME` swaps the task's
    config class (kjax.tasks) before the other task.* fields apply. Each nested dataclass
    is rebuilt once with all its changes, so its validation sees the final combination
    (e.g. rl.loss and rl.epochs together).
    """
    names = {f.name for f in dataclasses.fields(cfg)}
    nested: dict[str, dict[str, str]] = {}
    changes = {}
    for path, text in items.items():
        head, _, rest = path.partition(".")
        if head not in names:
            raise ValueError(
                f"unknown config field `{_prefix}{head}`; known: {', '.join(sorted(names))}."
            )
        if rest:
            nested.setdefault(head, {})[rest] = text
        else:
            changes[head] = _parse(getattr(cfg, head), text, _prefix + path)
    for head, sub in nested.items():
        current = getattr(cfg, head)
        if current is None and head == "k_schedule":
            current = KSchedule()
        if isinstance(current, TaskConfig) and "kind" in sub:
            # The kind is the config's class: start from the new task's defaults, then set
            # the other task.* fields on it.
            sub = dict(sub)
            kind = sub.pop("kind")
            cls = tasks.config_class(kind)
            current = current if type(current) is cls else cls()
        if not dataclasses.is_dataclass(current):
            raise ValueError(f"`config.{_prefix}{head}` is not a group; cannot set {sorted(sub)}.")
        changes[head] = override(current, sub, f"{_prefix}{head}.")
    return dataclasses.replace(cfg, **changes)


def _parse(current, text: str, path: str):
    if isinstance(current, enum.Enum):
        return coerce_enum(text, type(current), f"config.{path}")
    if isinstance(current, tuple) and current and isinstance(current[0], Operator):
        return _operators(text)
    if isinstance(current, tuple) and current and isinstance(current[0], enum.Enum):
        return tuple(t for t in text.replace(" ", "").split(",") if t)  # the group coerces
    if isinstance(current, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"`config.{path}` must be true or false; got {text!r}.")
        return text.lower() in ("true", "1")
    if isinstance(current, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"`config.{path}`: cannot parse {text!r}.") from None
    if isinstance(current, float) and isinstance(value, int):
        value = float(value)
    if current is not None and value is not None and type(value) is not type(current):
        raise ValueError(f"`config.{path}` must be a {type(current).__name__}; got {text!r}.")
    return value


def to_json(cfg) -> dict:
    """A JSON-able nested dict (enums by value): the run's identity for ensure_workdir.

    A field whose metadata is IDENTITY_IF_SET (added after runs were written) is left out
    while it holds its default, so a workdir written before the field existed resumes.
    """

    def kept(x, f) -> bool:
        return f.metadata != IDENTITY_IF_SET or getattr(x, f.name) != f.default

    def plain(x):
        if dataclasses.is_dataclass(x):
            fields = dataclasses.fields(x)
            return {f.name: plain(getattr(x, f.name)) for f in fields if kept(x, f)}
        if isinstance(x, enum.Enum):
            return x.value
        if isinstance(x, tuple | list):
            return [plain(v) for v in x]
        return x

    return plain(cfg)
