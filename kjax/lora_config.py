"""LoraConfig: the low-rank adapters of an RL run (`--config.model.lora.rank=16`), kept
apart from kjax.models.lora (which applies them) so that configs import no jax."""

from __future__ import annotations

import dataclasses
import enum

from kjax._fields import check_int, coerce_enum, is_real


class Projection(enum.Enum):
    """A projection LoRA can adapt, by its llama.py name (PEFT's target module)."""

    Q = "q"
    K = "k"
    V = "v"
    O = "o"  # noqa: E741 (the attention output projection's name)
    GATE = "gate"
    UP = "up"
    DOWN = "down"


ALL = tuple(Projection)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank: r (0 = off: full fine-tuning); alpha: PEFT's lora_alpha (scale alpha / r);
    dropout: must be 0 (a dropout mask would make the update's log-probs differ from the
    sampler's, so the PPO ratio would no longer be 1 on-policy); targets: the projections
    adapted (`--config.model.lora.targets=q,v`)."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[Projection, ...] = ALL

    def __post_init__(self):
        check_int(self.rank, "config.model.lora.rank", 0)
        if not is_real(self.alpha) or not self.alpha > 0:
            raise ValueError(f"`config.model.lora.alpha` must be a number > 0; got {self.alpha!r}.")
        if self.dropout != 0:
            raise ValueError(
                f"`config.model.lora.dropout` must be 0; got {self.dropout!r}: kjax's LoRA has "
                "no dropout (the update's log-probs must be the sampler's, or PPO's ratio is "
                "not 1 on-policy). Set it to 0."
            )
        targets = self.targets
        if isinstance(targets, str):
            targets = tuple(t for t in targets.replace(" ", "").split(",") if t)
        field = "config.model.lora.targets"
        targets = tuple(coerce_enum(t, Projection, field) for t in targets)
        if not targets or len(set(targets)) != len(targets):
            raise ValueError(f"`{field}` must name distinct projections of {ALL}; got {targets}.")
        object.__setattr__(self, "targets", tuple(p for p in ALL if p in targets))
        object.__setattr__(self, "alpha", float(self.alpha))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """PEFT's scaling alpha / r."""
        return self.alpha / self.rank


def coerce(value) -> LoraConfig:
    """A LoraConfig from itself or its to_json dict (experiment.json)."""
    if isinstance(value, LoraConfig):
        return value
    if isinstance(value, dict):
        return LoraConfig(**value)
    raise ValueError(f"`config.model.lora` must be a LoraConfig; got {value!r}.")
