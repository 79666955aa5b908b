"""Typed, frozen run configuration of experiments.train, and `--config.a.b=value` overrides.

Every option has one default here; presets in experiments/configs/ replace a few fields.
`TrainConfig.validate(devices)` checks cross-field constraints before any compute and
names the offending field.
"""

from __future__ import annotations

import ast
import dataclasses
import enum

from kjax.checkpoint import CheckpointConfig
from kjax.rl.objective import KSchedule, ObjectiveConfig, coerce_enum
from kjax.rl.optim import OptimizerConfig
from kjax.rl.train_step import StepConfig


class ModelKind(enum.Enum):
    TINY = "tiny"  # a random-init Llama of the sizes below, character tokenizer
    PRETRAINED = "pretrained"  # kjax.models.pretrained(name), its tokenizer + chat template
    HF_DIR = "hf_dir"  # a local Hugging Face directory (safetensors), e.g. Llama-3.1-8B


class TaskKind(enum.Enum):
    ARITH = "arith"  # kjax_arith, generated
    MATH = "math"  # math_jsonl builder over <task.manual_dir>/math/*.jsonl


class SFTLoss(enum.Enum):
    CE = "ce"  # token-mean cross-entropy
    DCO = "dco"  # Chen et al. 2025's confidence-limiting loss at N = sft.dco_n


class DType(enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    kind: ModelKind = ModelKind.TINY
    name: str = "smollm2-135m-instruct"  # PRETRAINED
    path: str = ""  # HF_DIR
    hidden_size: int = 64  # TINY sizes
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    dtype: DType = DType.FLOAT32  # compute dtype


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    kind: TaskKind = TaskKind.ARITH
    digits: int = 2
    operands: int = 2
    operators: str = "+-"  # any of "+-*"
    train_size: int = 4000
    test_size: int = 200
    data_seed: int = 0
    manual_dir: str = ""  # MATH: directory holding math/{train,test}.jsonl
    max_prompt_tokens: int = 0  # 0: the task's bound (TINY arith); prompts left-pad to it


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Warm start before RL; cached in `cache_dir` (default <workdir>/sft) by identity."""

    steps: int = 0
    batch_size: int = 64
    learning_rate: float = 3e-3
    loss: SFTLoss = SFTLoss.CE
    dco_n: int = 16
    cache_dir: str = ""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 20  # RL steps between evaluations (and at start and end)
    n_eval: int = 16  # samples per held-out problem; k in {1, 2, 4, ..., n_eval}
    problems: int = 64
    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One run: SFT warm start (optional), then `steps` RL steps of B prompts x N samples."""

    name: str = "run"
    seed: int = 0
    steps: int = 100
    batch_prompts: int = 16  # B per step (global, all hosts)
    samples: int = 8  # N per prompt
    max_new_tokens: int = 6  # T
    temperature: float = 1.0
    dynamic_sampling: bool = False  # drop all-zero-advantage groups, refill from next prompts
    objective: ObjectiveConfig = ObjectiveConfig()
    k_schedule: KSchedule | None = None
    rl: StepConfig = StepConfig()
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-3, total_steps=1000)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every=20, keep=2)
    mesh: MeshConfig = MeshConfig()
    verifier_workers: int = 0  # 0: verify in this process; else a kjax.rewards.pool

    def __post_init__(self):
        _coerce_enums(self, "")

    def validate(self, devices: int) -> TrainConfig:
        """Cross-field checks against `devices` (all hosts); returns self or raises."""
        positive = ("steps", "batch_prompts", "samples", "max_new_tokens")
        for field in positive:
            _need(getattr(self, field) >= 1, field, "must be >= 1", getattr(self, field))
        _need(self.temperature > 0, "temperature", "must be > 0", self.temperature)
        _need(self.verifier_workers >= 0, "verifier_workers", "must be >= 0", self.verifier_workers)
        try:
            self.objective.check_samples(self.samples, self.k_schedule)
        except ValueError as e:
            raise ValueError(f"config.objective / config.samples: {e}") from None
        n, e = self.eval.n_eval, self.eval
        _need(n >= 1 and n & (n - 1) == 0, "eval.n_eval", "must be a power of 2", n)
        _need(e.every >= 1 and e.problems >= 1, "eval.every/problems", "must be >= 1", e)
        _need(set(self.task.operators) <= set("+-*") and self.task.operators, "task.operators",
              "must be a non-empty string over '+-*'", self.task.operators)  # fmt: skip
        _need(self.sft.steps >= 0, "sft.steps", "must be >= 0", self.sft.steps)
        m = self.mesh
        sizes = [s for s in (m.data, m.fsdp, m.tensor)]
        _need(all(s >= 1 or s == -1 for s in sizes) and sizes.count(-1) <= 1, "mesh",
              "sizes must be >= 1 with at most one -1", sizes)  # fmt: skip
        known = m.data * m.fsdp * m.tensor * (-1 if -1 in sizes else 1)
        _need(devices % known == 0, "mesh", f"does not divide the {devices} devices", sizes)
        batch_devices = (devices // known if m.data == -1 else m.data) * (
            devices // known if m.fsdp == -1 else m.fsdp
        )
        parts = self.rl.minibatches * self.rl.microbatches * batch_devices
        _need(self.batch_prompts % parts == 0, "batch_prompts",
              f"must be a multiple of rl.minibatches * rl.microbatches * data*fsdp devices "
              f"= {parts}", self.batch_prompts)  # fmt: skip
        _need(self.eval.problems % batch_devices == 0, "eval.problems",
              f"must be a multiple of the data*fsdp devices ({batch_devices})",
              self.eval.problems)  # fmt: skip
        _need(self.optimizer.total_steps >= self.steps, "optimizer.total_steps",
              f"must be >= steps={self.steps} (the cosine schedule would end early)",
              self.optimizer.total_steps)  # fmt: skip
        if self.model.kind is ModelKind.HF_DIR:
            _need(bool(self.model.path), "model.path", "is required for kind HF_DIR", "")
        if self.task.kind is TaskKind.MATH:
            _need(bool(self.task.manual_dir), "task.manual_dir", "is required for MATH", "")
        return self


def _need(ok: bool, field: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"`config.{field}` {what}; got {value!r}.")


def _coerce_enums(obj, prefix: str) -> None:
    """Turns strings in enum-typed fields (from the command line) into members."""
    for f in dataclasses.fields(obj):
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, enum.Enum):
            value = coerce_enum(getattr(obj, f.name), type(default), f"config.{prefix}{f.name}")
            object.__setattr__(obj, f.name, value)


def override(cfg, items: dict[str, str], _prefix: str = ""):
    """cfg with fields set from strings: {"rl.epochs": "2", "objective.k": "4"}.

    Values parse by the current value's type (enums by name or value, bools as
    true/false). Each nested dataclass is rebuilt once with all its changes, so its
    validation sees the final combination (e.g. k_schedule kind and steps together).
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
        if not dataclasses.is_dataclass(current):
            raise ValueError(f"`config.{_prefix}{head}` is not a group; cannot set {sorted(sub)}.")
        changes[head] = override(current, sub, f"{_prefix}{head}.")
    return dataclasses.replace(cfg, **changes)


def _parse(current, text: str, path: str):
    if isinstance(current, enum.Enum):
        return coerce_enum(text, type(current), f"config.{path}")
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
    """A JSON-able nested dict (enums by value): the run's identity for ensure_workdir."""

    def plain(x):
        if dataclasses.is_dataclass(x):
            return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, enum.Enum):
            return x.value
        if isinstance(x, tuple | list):
            return [plain(v) for v in x]
        return x

    return plain(cfg)
