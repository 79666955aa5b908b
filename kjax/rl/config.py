"""Typed, frozen configuration of an RL run, and `--config.a.b=value` overrides.

A leaf module (the model/mesh, SFT/eval and step/objective groups live in their own
leaf modules beside it, and the text and JSON forms in kjax/rl/config_text.py; this module
re-exports them all): it imports option vocabularies only (the estimator enums of
kjax.objectives, CheckpointConfig, the task configs of kjax.tasks, whose modules import
their implementations lazily), never the kjax.rl code it configures. Every option has one
default here; each group validates its own fields on construction and
`TrainConfig.validate(devices)` checks what spans groups. Presets in experiments/configs/
replace a few fields.
"""

from __future__ import annotations

import dataclasses

from kjax._fields import check_int, coerce_enum, coerce_enums, is_real, need
from kjax.attention_backend import AttentionBackend
from kjax.checkpoint import CheckpointConfig
from kjax.data.synthetic import Operator
from kjax.lora_config import LoraConfig
from kjax.objectives.advantages import MaxAtKEstimator, MeanBaseline
from kjax.rl.config_text import override, to_json
from kjax.rl.model_config import DType, MeshConfig, ModelConfig, ModelKind
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
from kjax.rl.sft_config import EvalConfig, EvalSplit, SFTConfig, SFTLoss
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
