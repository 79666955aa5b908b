"""Typed, frozen configuration of an RL run, and `--config.a.b=value` overrides.

A leaf module: it imports option vocabularies only (the estimator enums of
kjax.objectives, CheckpointConfig, the task configs of kjax.tasks, whose modules import
their implementations lazily), never the kjax.rl code it configures. Every option has one
default here; each group validates its own fields on construction and
`TrainConfig.validate(devices)` checks what spans groups. Presets in experiments/configs/
replace a few fields.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import math

from kjax import tasks
from kjax._fields import check_int, coerce_enum, coerce_enums, is_real, need
from kjax.attention_backend import AttentionBackend
from kjax.checkpoint import CheckpointConfig
from kjax.data.synthetic import Operator
from kjax.lora_config import LoraConfig
from kjax.lora_config import coerce as coerce_lora
from kjax.objectives.advantages import MaxAtKEstimator, MeanBaseline
from kjax.rl.objective_config import (
    IDENTITY_IF_SET,
    OFFPOLICY_ESTIMATORS,
    BonAnchor,
    KSchedule,
    KScheduleKind,
    Objective,
    ObjectiveConfig,
    RewardSource,
    lag_exact_problem,
    offpolicy_estimator_names,
)
from kjax.rl.step_config import (
    KLEstimator,
    LagCorrection,
    LossAggregation,
    OffPolicyMaxAtK,
    OptimizerConfig,
    PackMode,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.sampler_weights import SamplerWeights
from kjax.tasks.arith import Config as ArithConfig
from kjax.tasks.arith import operators as _operators
from kjax.tasks.base import TaskConfig
from kjax.tasks.code import Config as CodeConfig
from kjax.tasks.countdown import Config as CountdownConfig
from kjax.tasks.humaneval import Config as HumanEvalConfig
from kjax.tasks.math import Config as MathConfig

__all__ = [
    "ArithConfig",
    "AttentionBackend",
    "BonAnchor",
    "SamplerWeights",
    "CheckpointConfig",
    "CodeConfig",
    "CountdownConfig",
    "DType",
    "EvalConfig",
    "EvalSplit",
    "HumanEvalConfig",
    "KLEstimator",
    "KSchedule",
    "KScheduleKind",
    "LagCorrection",
    "LossAggregation",
    "RewardSource",
    "MathConfig",
    "MaxAtKEstimator",
    "MeanBaseline",
    "MeshConfig",
    "ModelConfig",
    "LoraConfig",
    "ModelKind",
    "Objective",
    "ObjectiveConfig",
    "OffPolicyMaxAtK",
    "Operator",
    "OptimizerConfig",
    "PackMode",
    "PolicyLoss",
    "RatioLevel",
    "SFTConfig",
    "SFTLoss",
    "StepConfig",
    "TaskConfig",
    "TrainConfig",
    "coerce_enum",
    "override",
    "to_json",
]


# -------------------------------------------------------------------------------- model


class ModelKind(enum.Enum):
    TINY = "tiny"  # a random-init Llama of the sizes below, character tokenizer
    PRETRAINED = "pretrained"  # kjax.models.pretrained(name), its tokenizer + chat template
    HF_DIR = "hf_dir"  # a local HF directory (safetensors): Llama, Qwen2/2.5, Qwen3, Mistral


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
    dtype: DType = DType.FLOAT32  # compute dtype (sampler, train step, SFT)
    # The attention backend of the update and the sampler's prefill (kjax/models/
    # attention.py): AUTO is a kernel on TPU/GPU and the jnp reference on CPU.
    attention: AttentionBackend = dataclasses.field(
        default=AttentionBackend.AUTO, metadata=IDENTITY_IF_SET
    )
    # Low-rank adapters on the RL update (rank 0: full fine-tuning); kjax.models.lora.
    lora: LoraConfig = dataclasses.field(default=LoraConfig(), metadata=IDENTITY_IF_SET)

    def __post_init__(self):
        coerce_enums(self, "model.")
        object.__setattr__(self, "lora", coerce_lora(self.lora))
        for field in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
        ):
            check_int(getattr(self, field), f"config.model.{field}", 1)
        need(
            self.hidden_size % self.num_heads == 0,
            "model.hidden_size",
            f"must be a multiple of model.num_heads={self.num_heads}",
            self.hidden_size,
        )
        need(
            self.num_heads % self.num_kv_heads == 0,
            "model.num_kv_heads",
            f"must divide model.num_heads={self.num_heads}",
            self.num_kv_heads,
        )

    @property
    def compute_dtype(self):
        """The one dtype resolution (a jnp dtype) used by the model, sampler and updates."""
        import jax.numpy as jnp

        return jnp.dtype(self.dtype.value)


# --------------------------------------------------------------------------- task, SFT


class EvalSplit(enum.Enum):
    """Which problems `eval` scores: the held-out TEST split (what tables report), or the
    VALIDATION split (task.validation_size problems held out of training, disjoint from
    TEST: what a tuning protocol selects on, so no choice is made on the reported problems)."""

    TEST = "test"
    VALIDATION = "validation"


class SFTLoss(enum.Enum):
    CE = "ce"  # token-mean cross-entropy
    DCO = "dco"  # Chen, Raventos et al. 2025's (DCO) confidence-limiting loss at N = sft.dco_n


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Warm start before RL; cached in `cache_dir` (default <workdir>/sft) by identity."""

    steps: int = 0
    batch_size: int = 64
    learning_rate: float = 3e-3
    loss: SFTLoss = SFTLoss.CE
    dco_n: int = 16
    cache_dir: str = ""
    # The warm start's seed (init, SFT data order). None: the run's seed. A fixed value
    # gives every run seed the same warm start, so seeds vary only the RL: what a paper
    # that fine-tunes one base model varies, and a far smaller paired variance.
    seed: int | None = None

    def __post_init__(self):
        coerce_enums(self, "sft.")
        check_int(self.steps, "config.sft.steps", 0)
        if self.seed is not None:
            check_int(self.seed, "config.sft.seed", 0)
        check_int(self.batch_size, "config.sft.batch_size", 1)
        check_int(self.dco_n, "config.sft.dco_n", 1)
        need(
            is_real(self.learning_rate) and self.learning_rate > 0,
            "sft.learning_rate",
            "must be > 0",
            self.learning_rate,
        )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 20  # RL steps between evaluations (and at start and end)
    n_eval: int = 16  # samples per held-out problem; k in {1, 2, 4, ..., n_eval}
    problems: int = 64
    temperature: float = 1.0
    split: EvalSplit = EvalSplit.TEST  # VALIDATION needs task.validation_size > 0

    def __post_init__(self):
        coerce_enums(self, "eval.")
        n = self.n_eval
        need(
            isinstance(n, int) and n >= 1 and n & (n - 1) == 0,
            "eval.n_eval",
            "must be a power of 2",
            n,
        )
        check_int(self.every, "config.eval.every", 1)
        check_int(self.problems, "config.eval.problems", 1)
        need(
            is_real(self.temperature) and self.temperature > 0,
            "eval.temperature",
            "must be > 0",
            self.temperature,
        )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes of the training mesh; one may be -1 (the remaining devices).

    sampler_devices: 0 (the sampler runs on the training mesh), or the number of devices
      (the first ones) of a separate sampling group, data-parallel, which samples step
      t + rl.policy_lag's rollouts while the other devices run step t's update; the
      training mesh is then made of the remaining devices.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    sampler_devices: int = 0

    def __post_init__(self):
        sizes = [self.data, self.fsdp, self.tensor]
        need(
            all(isinstance(s, int) and (s >= 1 or s == -1) for s in sizes) and sizes.count(-1) <= 1,
            "mesh",
            "sizes must be >= 1 with at most one -1",
            sizes,
        )
        check_int(self.sampler_devices, "config.mesh.sampler_devices", 0)

    def training_devices(self, devices: int) -> int:
        """Devices of the training mesh out of `devices` in all."""
        need(
            self.sampler_devices < devices,
            "mesh.sampler_devices",
            f"must leave devices to train on (there are {devices}); lower it, or set 0 to "
            "sample on the training mesh",
            self.sampler_devices,
        )
        return devices - self.sampler_devices

    def resolve(self, devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) with -1 filled in for `devices` (the training mesh's, after
        training_devices); the one mesh resolution."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = math.prod(s for s in sizes if s != -1)
        need(devices % known == 0, "mesh", f"does not divide the {devices} devices", sizes)
        if -1 in sizes:
            sizes[sizes.index(-1)] = devices // known
        need(
            math.prod(sizes) == devices,
            "mesh",
            f"must use all {devices} devices (or set one size to -1)",
            sizes,
        )
        return tuple(sizes)

    def batch_devices(self, devices: int) -> int:
        """Devices B is sharded over (data x fsdp)."""
        data, fsdp, _ = self.resolve(devices)
        return data * fsdp


# -------------------------------------------------------------------------------- a run


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
    # 0: the sampler decodes all B*N rows until the last sample stops. f >= 1: it moves
    # the live samples into halved batches as others stop, down to f rows
    # (kjax.sampling.compact_sizes): the same tokens; log-probs equal to float rounding
    # only (XLA's dots round a row differently at another batch size), hence off by default.
    sampler_compact_floor: int = dataclasses.field(default=0, metadata=IDENTITY_IF_SET)
    # The layout the sampler reads the weights in (kjax.sampler_weights): AUTO is the
    # trainer's on CPUs and one device (the same tokens either way), tensor-only on a
    # TPU/GPU mesh with fsdp > 1 where that fits beside the KV cache.
    sampler_weights: SamplerWeights = dataclasses.field(
        default=SamplerWeights.AUTO, metadata=IDENTITY_IF_SET
    )
    dynamic_sampling: bool = False  # drop all-zero-advantage groups, refill from next prompts
    objective: ObjectiveConfig = ObjectiveConfig()
    k_schedule: KSchedule | None = None
    rl: StepConfig = StepConfig()
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-3, total_steps=1000)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = ArithConfig()  # a task module's Config, chosen by task.kind
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every=20, keep=2)
    mesh: MeshConfig = MeshConfig()
    verifier_workers: int = 0  # 0: verify in this process; else a kjax.rewards.pool

    def __post_init__(self):
        check_int(self.seed, "config.seed", 0)  # jax.random.key and the data order need >= 0
        for field in ("steps", "batch_prompts", "samples", "max_new_tokens"):
            value = getattr(self, field)
            need(isinstance(value, int) and value >= 1, field, "must be an int >= 1", value)
        need(
            is_real(self.temperature) and self.temperature > 0,
            "temperature",
            "must be > 0",
            self.temperature,
        )
        check_int(self.sampler_compact_floor, "config.sampler_compact_floor", 0)
        coerce_enums(self, "")
        need(self.verifier_workers >= 0, "verifier_workers", "must be >= 0", self.verifier_workers)
        need(
            isinstance(self.task, TaskConfig),
            "task",
            "must be a task module's Config (kjax.tasks; e.g. ArithConfig(), CountdownConfig())",
            self.task,
        )

    def _check_lag(self, devices: int) -> None:
        """A stale rollout's correction against the objective; the sampling group."""
        rl = self.rl
        if rl.lag_correction is LagCorrection.EXACT:
            problem = lag_exact_problem(self.objective)
            need(
                problem is None,
                "rl.lag_correction",
                f"is EXACT but {problem}. Choose rl.lag_correction=TIS (with rl.tis_cap; "
                "biased: each sample's own truncated ratio, the others' ignored), NONE "
                "(biased: no correction), or rl.policy_lag=0",
                rl.lag_correction.name,
            )
        sampler = self.mesh.sampler_devices
        if sampler:
            need(
                self.eval.problems % sampler == 0,
                "eval.problems",
                f"must be a multiple of mesh.sampler_devices={sampler} (the sampling group "
                "evaluates too)",
                self.eval.problems,
            )
            need(
                self.batch_prompts % sampler == 0,
                "batch_prompts",
                f"must be a multiple of mesh.sampler_devices={sampler}",
                self.batch_prompts,
            )

    # Settings that would run, but not as a user reading them expects: refused up front.
    def _check_silent_settings(self) -> None:
        need(
            not self.model.path or self.model.kind is ModelKind.HF_DIR,
            "model.path",
            f"is set but model.kind is {self.model.kind.name}, which never reads it (the run "
            "would train another model); add --config.model.kind=hf_dir to train the folder's "
            "model, or drop model.path",
            self.model.path,
        )
        lag, sampler = self.rl.policy_lag, self.mesh.sampler_devices
        if not lag:
            need(
                self.rl.lag_correction is not LagCorrection.EXACT,
                "rl.lag_correction",
                "is EXACT at rl.policy_lag=0, which is not a no-op (it re-weights every update "
                "by the sequence ratios, so the loss and the checkpoints differ from the plain "
                "run's in the last bits); set rl.lag_correction=NONE, or rl.policy_lag >= 1",
                "EXACT",
            )
            need(
                not sampler,
                "mesh.sampler_devices",
                "is a sampling group, which draws step t + rl.policy_lag's rollouts while the "
                "other devices run step t's update; at rl.policy_lag=0 nothing overlaps, so "
                "each group idles while the other works. Set rl.policy_lag >= 1, or "
                "mesh.sampler_devices=0",
                sampler,
            )
        # lag >= steps is allowed (a smoke budget of a lagged table) but named in the run's
        # log: every rollout then comes from the initial parameters (components._warn_lag).

    def _sampler_note(self, devices: int) -> str:
        """What a mesh error needs to say when the sampling group took some devices."""
        s = self.mesh.sampler_devices
        if not s:
            return ""
        return (
            f" (mesh.sampler_devices={s} took {s} of the {devices} devices for sampling; the "
            f"training mesh has the other {devices - s}: size the mesh and batch for those, "
            "or lower mesh.sampler_devices)"
        )

    def ks(self) -> tuple[int, ...]:
        """Every k the objective takes during the run (one entry for MEAN and mixtures)."""
        return self.k_schedule.values() if self.k_schedule is not None else (self.objective.k,)

    def k_at(self, step: int) -> int:
        """The objective's k at RL step `step` (0-based)."""
        return self.k_schedule(step) if self.k_schedule is not None else self.objective.k

    def validate(self, devices: int) -> TrainConfig:
        """Checks across groups, against `devices` (all hosts); returns self or raises."""
        try:
            self.objective.check_samples(self.samples, self.k_schedule)
        except ValueError as e:
            raise ValueError(f"config.objective / config.samples: {e}") from None
        off = self.rl.offpolicy_max_at_k
        estimator = self.objective.max_at_k_estimator
        if off is not OffPolicyMaxAtK.OFF and not (
            self.objective.objective is Objective.MAX_AT_K and estimator in OFFPOLICY_ESTIMATORS
        ):
            raise ValueError(
                f"`config.rl.offpolicy_max_at_k`={off.name} needs objective MAX_AT_K with "
                f"estimator {offpolicy_estimator_names(' / ')} (the estimators with an exact "
                f"off-policy form); got objective {self.objective.objective.name}, estimator "
                f"{estimator.name}. Set rl.offpolicy_max_at_k=OFF (PPO's ratio then corrects "
                "the fixed advantages) or change the estimator."
            )
        if self.dynamic_sampling and self.objective.objective is Objective.MEAN:
            need(
                self.objective.mean_baseline is not MeanBaseline.SHRINKAGE,
                "dynamic_sampling",
                "cannot pick informative groups under mean_baseline=SHRINKAGE (its baseline "
                "mixes in other prompts, so an all-equal group gets non-zero advantages); set "
                "dynamic_sampling=false or another baseline",
                True,
            )
        need(
            self.objective.bon_anchor is not BonAnchor.REFERENCE or self.rl.kl_coef > 0,
            "objective.bon_anchor",
            "is REFERENCE, whose anchor samples come from the fixed KL reference, but "
            "rl.kl_coef is 0 (no reference is held, and vBoN's objective has the KL term); "
            "set rl.kl_coef > 0 (vBoN's weight is 1) or bon_anchor=group",
            "REFERENCE",
        )
        need(
            not (self.dynamic_sampling and self.objective.max_at_k_shrinkage),
            "dynamic_sampling",
            "cannot pick informative groups under objective.max_at_k_shrinkage (the shrunk "
            "baseline mixes in other prompts, so an all-equal group gets non-zero "
            "advantages); set dynamic_sampling=false or max_at_k_shrinkage=false",
            True,
        )
        # Paths are left to the command line by presets, so they are checked here.
        if self.model.kind is ModelKind.HF_DIR:
            need(bool(self.model.path), "model.path", "is required for kind HF_DIR", "")
        if self.eval.split is EvalSplit.VALIDATION:
            need(
                self.task.validation_size > 0,
                "eval.split",
                "is VALIDATION but task.validation_size is 0 (no validation split); set "
                "task.validation_size to the problems to hold out, or eval.split=test",
                self.eval.split.name,
            )
        self.task.check(self.model.kind is ModelKind.TINY)
        need(
            self.task.sft_targets or not self.sft.steps,
            "sft.steps",
            f"must be 0 for the {self.task.kind} task (it has no reference answers to "
            "fine-tune on); set sft.steps=0, or warm-start another way (model.kind, model.path)",
            self.sft.steps,
        )
        self._check_lag(devices)
        self._check_silent_settings()
        total, devices = devices, self.mesh.training_devices(devices)
        try:
            batch_devices = self.mesh.batch_devices(devices)
        except ValueError as e:
            raise ValueError(f"{str(e).rstrip('.')}{self._sampler_note(total)}.") from None
        parts = self.rl.minibatches * self.rl.microbatches * batch_devices
        need(
            self.batch_prompts % parts == 0,
            "batch_prompts",
            f"must be a multiple of rl.minibatches * rl.microbatches * data*fsdp devices = {parts}"
            f"{self._sampler_note(total)}",
            self.batch_prompts,
        )
        need(
            self.eval.problems % batch_devices == 0,
            "eval.problems",
            f"must be a multiple of the data*fsdp devices ({batch_devices})",
            self.eval.problems,
        )
        need(
            self.optimizer.total_steps >= self.steps,
            "optimizer.total_steps",
            f"must be >= steps={self.steps} (the cosine schedule would end early)",
            self.optimizer.total_steps,
        )
        return self


# ---------------------------------------------------------------------- command line, JSON


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
