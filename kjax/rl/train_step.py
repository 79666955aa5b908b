"""The RL update as one sharded jax.jit: PG or PPO epochs over a rollout batch.

`make_train_step` returns step(state, batch, ref_params) -> (state, metrics). The state
is donated; B is sharded over the mesh's batch axes and N never is. Completion logprobs
are recomputed by the model over prompt + completion ([B*N, S+T] inside, [B,N,T] outside).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import sharding
from kjax.models import llama
from kjax.models.config import LlamaConfig
from kjax.rl import losses
from kjax.rl.objective import Objective, ObjectiveConfig, coerce_enum, compute_advantages


class TrainState(NamedTuple):
    """params: model dict; opt_state: optax state; step: [] int32 RL steps done;
    rng: [2] uint32 key data (jax.random.key_data), the run's base key."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


class RLBatch(NamedTuple):
    """One rollout batch. prompts/prompt_mask: [B,S] int32/bool (left-padded);
    tokens, mask, sampler_logprobs: [B,N,T] (kjax.sampling.Rollouts); scores,
    advantages: [B,N] float32 (advantages in the sum convention)."""

    prompts: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array
    sampler_logprobs: jax.Array
    scores: jax.Array
    advantages: jax.Array


class PolicyLoss(enum.Enum):
    PG = "pg"  # REINFORCE surrogate; one update per rollout unless epochs > 1
    PPO = "ppo"  # clipped ratio against the step's starting policy


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """How one rollout batch becomes updates: epochs x minibatches optimizer updates,
    each accumulating gradients over `microbatches` (all split B; N stays whole).

    Epochs after the first with a MAX_AT_K objective use Bagirov et al.'s off-policy
    max@k weights with the PG surrogate (they carry the importance ratio themselves).
    tis_cap: truncated importance weights against the sampler's logprobs (None: off).
    """

    loss: PolicyLoss = PolicyLoss.PG
    epochs: int = 1
    minibatches: int = 1
    microbatches: int = 1
    aggregation: losses.LossAggregation = losses.LossAggregation.TOKEN_SUM
    ppo_epsilon: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: losses.KLEstimator = losses.KLEstimator.K3
    entropy_coef: float = 0.0
    tis_cap: float | None = None

    def __post_init__(self):
        for field, cls in (
            ("loss", PolicyLoss),
            ("aggregation", losses.LossAggregation),
            ("kl_estimator", losses.KLEstimator),
        ):
            object.__setattr__(self, field, coerce_enum(getattr(self, field), cls, f"rl.{field}"))
        for field in ("epochs", "minibatches", "microbatches"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`rl.{field}` must be an int >= 1; got {value!r}.")
        if not 0 < self.ppo_epsilon < 1:
            raise ValueError(f"`rl.ppo_epsilon` must be in (0, 1); got {self.ppo_epsilon}.")
        for field in ("kl_coef", "entropy_coef"):
            if getattr(self, field) < 0:
                raise ValueError(f"`rl.{field}` must be >= 0; got {getattr(self, field)}.")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"`rl.tis_cap` must be > 0 or None; got {self.tis_cap}.")

    @property
    def needs_old_logprobs(self) -> bool:
        return self.loss is PolicyLoss.PPO or self.epochs > 1 or self.tis_cap is not None


def completion_logits(params, config: LlamaConfig, prompts, prompt_mask, tokens, dtype):
    """Logits [B,N,T,V] predicting each completion token, from one forward pass over
    [B*N, S+T] (the prompt repeated per sample). Positions count real prompt tokens, as in
    the sampler, so these equal the sampler's raw model logits."""
    B, N, T = tokens.shape
    S = prompts.shape[1]
    seq = jnp.concatenate([jnp.repeat(prompts, N, axis=0), tokens.reshape(B * N, T)], axis=1)
    attn = jnp.concatenate(
        [jnp.repeat(prompt_mask.astype(bool), N, axis=0), jnp.ones((B * N, T), bool)], axis=1
    )
    logits = llama.forward(params, config, seq, attention_mask=attn, dtype=dtype)
    return logits[:, S - 1 : S + T - 1].reshape(B, N, T, -1)


def completion_logprobs(params, config: LlamaConfig, prompts, prompt_mask, tokens, dtype):
    """log pi(token) [B,N,T] float32 of completions tokens [B,N,T] given prompts [B,S]."""
    logits = completion_logits(params, config, prompts, prompt_mask, tokens, dtype)
    return losses.token_logprobs(logits, tokens)


def _split(tree, parts: int, spec: P):
    """[B, ...] -> [parts, B/parts, ...]: row j of part p is row j*parts + p, so each
    device's block of B stays on that device (no resharding)."""

    def one(x):
        y = x.reshape(x.shape[0] // parts, parts, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(y, spec) if spec is not None else y

    return jax.tree.map(one, tree)


def make_train_step(
    model_config: LlamaConfig,
    cfg: StepConfig,
    objective: ObjectiveConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state_shardings: TrainState,
    *,
    dtype=jnp.float32,
    trace_hook: Callable[[], None] | None = None,
):
    """Returns step(state, batch, ref_params, k) -> (state, metrics), one jax.jit.

    Args:
      model_config: the policy's LlamaConfig (static).
      cfg: StepConfig. objective: ObjectiveConfig (for later-epoch off-policy weights).
      optimizer: optax transformation (kjax.rl.optim.make_optimizer).
      mesh: B is sharded over the batch rule's mesh axes (kjax.sharding.RULES).
      state_shardings: TrainState of NamedShardings (init_train_state's output shardings).
      trace_hook: called each time the step is traced (tests count retraces).

    The returned step takes state (donated), batch (RLBatch, B divisible by
    minibatches * microbatches * batch devices), ref_params (frozen reference params,
    or None when cfg.kl_coef == 0) and k (static int, this step's objective k).
    Metrics: scalar means over updates, plus `finite` (all losses and grads finite).
    """
    batch_axes = sharding.RULES["batch"]
    batch_sh = NamedSharding(mesh, P(batch_axes))
    split_spec = NamedSharding(mesh, P(None, batch_axes))
    replicated = NamedSharding(mesh, P())
    use_offpolicy = objective.objective is Objective.MAX_AT_K

    def loss_fn(params, mb: RLBatch, old_logprobs, ref_params, k: int, later_epoch: bool):
        T = mb.tokens.shape[-1]
        need_logits = cfg.entropy_coef > 0
        logits = completion_logits(params, model_config, mb.prompts, mb.prompt_mask, mb.tokens,
                                   dtype)  # fmt: skip
        logp = losses.token_logprobs(logits, mb.tokens)
        agg = dict(aggregation=cfg.aggregation, max_len=T)
        is_w, metrics = None, {}
        if cfg.tis_cap is not None:
            is_w, metrics = losses.truncated_importance_weights(
                old_logprobs, mb.sampler_logprobs, mb.mask, cfg.tis_cap
            )
        if later_epoch and use_offpolicy:
            log_ratio = jax.lax.stop_gradient(
                losses.sequence_logprob(logp, mb.mask)
                - losses.sequence_logprob(old_logprobs, mb.mask)
            )
            adv = compute_advantages(objective, k, mb.scores, log_ratio=log_ratio)
            loss, m = losses.policy_gradient_loss(logp, adv, mb.mask, **agg, is_weights=is_w)
        elif cfg.loss is PolicyLoss.PPO:
            loss, m = losses.ppo_clip_loss(
                logp, old_logprobs, mb.advantages, mb.mask, **agg, epsilon=cfg.ppo_epsilon,
                dual_clip=cfg.dual_clip, is_weights=is_w,
            )  # fmt: skip
        else:
            loss, m = losses.policy_gradient_loss(logp, mb.advantages, mb.mask, **agg,
                                                  is_weights=is_w)  # fmt: skip
        metrics.update(m)
        if cfg.kl_coef > 0:
            ref = completion_logprobs(ref_params, model_config, mb.prompts, mb.prompt_mask,
                                      mb.tokens, dtype)  # fmt: skip
            kl, m = losses.kl_penalty_loss(logp, ref, mb.mask, cfg.kl_estimator)
            loss, metrics = loss + cfg.kl_coef * kl, {**metrics, **m}
        if need_logits:
            ent, m = losses.entropy_loss(logits, mb.mask)
            loss, metrics = loss + cfg.entropy_coef * ent, {**metrics, **m}
        metrics["loss"] = loss
        return loss, metrics

    def step(state: TrainState, batch: RLBatch, ref_params, k: int):
        if trace_hook is not None:
            trace_hook()
        B = batch.prompts.shape[0]
        if B % (cfg.minibatches * cfg.microbatches):
            raise ValueError(
                f"B={B} prompts must divide into rl.minibatches * rl.microbatches = "
                f"{cfg.minibatches * cfg.microbatches}."
            )
        old = jnp.zeros(batch.tokens.shape, jnp.float32)
        if cfg.needs_old_logprobs:  # the step's starting policy, chunked like the updates
            chunks = _split(batch, cfg.minibatches * cfg.microbatches, split_spec)
            old = jax.lax.map(
                lambda b: completion_logprobs(state.params, model_config, b.prompts,
                                              b.prompt_mask, b.tokens, dtype), chunks,
            )  # fmt: skip
            old = jax.lax.stop_gradient(_merge(old, batch_sh))
        minis = _split((batch, old), cfg.minibatches, split_spec)

        def update(carry, minibatch, later_epoch):
            """One optimizer update, gradients averaged over the minibatch's microbatches."""
            params, opt_state = carry
            grad_fn = jax.grad(loss_fn, has_aux=True)

            def accumulate(grads_sum, micro):
                grads, metrics = grad_fn(params, *micro, ref_params, k, later_epoch)
                return jax.tree.map(jnp.add, grads_sum, grads), metrics

            zeros = jax.tree.map(jnp.zeros_like, params)
            grads, metrics = jax.lax.scan(
                accumulate, zeros, _split(minibatch, cfg.microbatches, split_spec)
            )
            grads = jax.tree.map(lambda g: g / cfg.microbatches, grads)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            metrics = {**jax.tree.map(jnp.mean, metrics), "grad_norm": optax.tree.norm(grads)}
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, later_epoch: bool):
            return jax.lax.scan(lambda c, mb: update(c, mb, later_epoch), carry, minis)

        carry, metrics = epoch((state.params, state.opt_state), False)
        per_update = jax.tree.map(lambda x: x.reshape(-1), metrics)
        if cfg.epochs > 1:  # later epochs share one traced body
            carry, later = jax.lax.scan(
                lambda c, _: epoch(c, True), carry, None, length=cfg.epochs - 1
            )
            later = jax.tree.map(lambda x: x.reshape(-1), later)
            per_update = {  # PPO-only metrics describe the first epoch alone
                name: jnp.concatenate([v, later[name]]) if name in later else v
                for name, v in per_update.items()
            }
        out = {name: jnp.mean(v) for name, v in per_update.items()}
        out["finite"] = jnp.all(jnp.isfinite(per_update["loss"])) & jnp.all(
            jnp.isfinite(per_update["grad_norm"])
        )
        out["reward_mean"] = jnp.mean(batch.scores)
        params, opt_state = carry
        return TrainState(params, opt_state, state.step + 1, state.rng), out

    batch_shardings = RLBatch(*([batch_sh] * len(RLBatch._fields)))
    ref_sh = state_shardings.params if cfg.kl_coef > 0 else None
    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_shardings, ref_sh),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
        static_argnums=(3,),
    )


def _merge(x, batch_sh):
    """Inverse of _split for one array: [parts, B/parts, ...] -> [B, ...]."""
    y = x.swapaxes(0, 1)
    y = y.reshape(y.shape[0] * y.shape[1], *y.shape[2:])
    return jax.lax.with_sharding_constraint(y, batch_sh)


def init_train_state(
    params, optimizer: optax.GradientTransformation, key: jax.Array, mesh: Mesh
) -> TrainState:
    """A TrainState on `mesh`: params as given (already sharded), optimizer state sharded
    like the params it mirrors, step 0, key data of `key`; scalars replicated."""
    opt_state = jax.jit(optimizer.init)(params)
    replicated = NamedSharding(mesh, P())

    def place(x):
        on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        return x if on_mesh else jax.device_put(x, replicated)

    state = TrainState(params, opt_state, jnp.int32(0), jax.random.key_data(key))
    return jax.tree.map(place, state)


def shardings_of(tree):
    """The NamedSharding of every array of a pytree (e.g. init_train_state's output)."""
    return jax.tree.map(lambda x: x.sharding, tree)
