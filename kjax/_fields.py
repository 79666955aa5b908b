"""Field checks shared by the config groups (kjax.rl.config, the groups it re-exports, and
the task configs of kjax.tasks)."""

from __future__ import annotations

import dataclasses
import enum
import numbers

# dataclasses.field metadata of a field added after runs were written: kjax.rl.config.to_json
# leaves it out of the run's identity while it holds its default, so those runs resume.
IDENTITY_IF_SET = {"identity": "if_set"}


def coerce_enum(value, enum_cls: type[enum.Enum], field: str):
    """`value` as an `enum_cls` member; accepts the member, its value or its name (so
    flags can say `--config.objective.objective=max_at_k`); raises naming `field`."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for member in enum_cls:
            if value.lower() in (str(member.value).lower(), member.name.lower()):
                return member
    choices = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"`{field}` must be one of {enum_cls.__name__} {{{choices}}}; got {value!r}.")


def check_int(value, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{field}` must be an int >= {minimum}; got {value!r}.")
    return int(value)


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def need(ok: bool, field: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"`config.{field}` {what}; got {value!r}.")


def coerce_enums(obj, prefix: str) -> None:
    """Turns strings in enum-typed fields (from the command line) into members."""
    for f in dataclasses.fields(obj):
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, enum.Enum):
            value = coerce_enum(getattr(obj, f.name), type(default), f"config.{prefix}{f.name}")
            object.__setattr__(obj, f.name, value)
