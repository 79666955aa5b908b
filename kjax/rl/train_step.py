"""The RL update as one sharded jax.jit: epochs x minibatches optimizer updates of a rollout.

`loss_fn(params, batch, cfg, model_config, ...)` is the loss every update differentiates, a
pure function of one (micro)batch. `make_train_step` builds the jitted update from it and
returns step(state, batch, ref_params, k) -> (state, metrics); the state is donated, B is
sharded over the mesh's batch axes and N never is. Token log-probs come from
kjax.rl.forward. Advantages arrive with the batch (computed once per rollout); the
step's first update is on-policy, later ones use the PPO surrogate with each sample's ratio
against the step's starting policy, optionally re-weighted by a function the caller passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import sharding
from kjax.models import lora
from kjax.models.config import LlamaConfig
from kjax.rl import batch_packing, forward, losses, packing
from kjax.rl.step_config import (
    LagCorrection,
    OffPolicyMaxAtK,
    PackMode,
    PolicyLoss,
    StepConfig,
)

__all__ = [
    "PolicyLoss",
    "RLBatch",
    "StepConfig",
    "TrainState",
    "init_train_state",
    "loss_fn",
    "loss_of_logprobs",
    "make_train_step",
    "optimizer_shardings",
    "shardings_of",
]


class TrainState(NamedTuple):
    """params: model dict; opt_state: optax state of its trainable part (lora.split: the
    adapters under LoRA, else everything); step: [] int32 RL steps done;
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


# (scores [B,N], log_ratio [B,N], k [] int32) -> advantages [B,N]; see
# kjax.rl.objective.offpolicy_reweighter.
Reweight = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _split(tree, parts: int, spec):
    """[B, ...] -> [parts, B/parts, ...]: row j of part p is row j*parts + p, so each
    device's block of B stays on that device (no resharding)."""

    def one(x):
        y = x.reshape(x.shape[0] // parts, parts, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(y, spec)

    return jax.tree.map(one, tree)


def _merge(x, batch_sh):
    """Inverse of _split for one array: [parts, B/parts, ...] -> [B, ...]."""
    y = x.swapaxes(0, 1)
    y = y.reshape(y.shape[0] * y.shape[1], *y.shape[2:])
    return jax.lax.with_sharding_constraint(y, batch_sh)


def loss_fn(
    params,
    batch: RLBatch,
    cfg: StepConfig,
    model_config: LlamaConfig,
    *,
    old_logprobs: jax.Array | None = None,
    ref_logprobs: jax.Array | None = None,
    k: jax.Array | int | None = None,
    first: jax.Array | bool = True,
    reweight: Reweight | None = None,
    dtype=jnp.float32,
    temperature: float = 1.0,
    pack_rows: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of one (micro)batch, differentiated by every update of make_train_step.

    A pure function of its arrays; cfg, model_config, reweight, dtype and temperature are
    static (hashable), so `jax.jit(loss_fn, static_argnames=(...))` or a functools.partial
    binding them is jit-friendly:

      loss = surrogate(logp, A) + kl_coef * KL(logp, ref_logprobs) + entropy_coef * (-H)

    each term reduced over T by cfg.aggregation (T_max = T), summed over N and averaged
    over B (kjax.rl.losses). logp [B,N,T] = log softmax(logits / temperature) of `tokens`
    under `params` (kjax.rl.forward.completion_logprobs). surrogate is PG's
    -(1/B) sum_{b,i} A_bi agg_t(w_bit logp_bit) or PPO's clipped ratio against
    old_logprobs (cfg.ratio_level, ppo_epsilon, dual_clip); w are truncated importance
    weights of old_logprobs against batch.sampler_logprobs when cfg.tis_cap is set (else
    1). A = batch.advantages when `first` (or without `reweight`), else
    reweight(scores, log_ratio, k) with log_ratio [B,N] the stop-gradient sequence
    log-ratio of logp against old_logprobs.

    With cfg.lag_correction=EXACT (stale rollouts, StepConfig.policy_lag) old_logprobs is
    batch.sampler_logprobs, the behaviour policy mu's, whatever is passed; every update
    uses reweight(scores, log_ratio, k) (the batch's advantages when reweight is None:
    MEAN), and PG weights sample i by its sequence ratio w_i = exp(log_ratio_i), so the
    expected gradient is sum_i rho_i A'_i grad log pi(y_i) = grad J_k at params.

    Args:
      params: the policy's params (kjax.models.llama layout); the only differentiated input.
      batch: RLBatch: prompts/prompt_mask [B,S], tokens/mask/sampler_logprobs [B,N,T],
        scores/advantages [B,N] (advantages in the sum convention).
      cfg: StepConfig (loss, aggregation, PPO/TIS/KL/entropy options; the split options
        epochs/minibatches/microbatches are make_train_step's, not read here).
      model_config: the policy's LlamaConfig.
      old_logprobs: [B,N,T] float32 log-probs of the step's starting policy (constants);
        required when cfg.needs_old_logprobs (PPO or TIS), else ignored.
      ref_logprobs: [B,N,T] float32 log-probs of the KL reference (constants); required
        when cfg.kl_coef > 0, else ignored.
      k: [] int32, read only by `reweight`.
      first: [] bool (may be traced): the update is the step's first, whose advantages
        are the batch's; only read with `reweight`.
      reweight: the off-policy max@k re-weighting (see make_train_step), or None.
      dtype: the model's compute dtype.
      temperature: static float > 0, the rollouts' sampling temperature.
      pack_rows: static R: the forward runs on the completions packed into R rows per
        group (kjax.rl.packing), or with cfg.pack=BATCH into R rows per batch shard
        (kjax.rl.batch_packing); the same loss to float rounding. None: padded.

    Returns:
      (loss [] float32, metrics: dict of [] float32, the losses' metrics plus "loss").
    """
    stats = _token_stats(
        params,
        model_config,
        batch,
        pack_rows,
        cfg.pack,
        dtype=dtype,
        with_entropy=cfg.entropy_coef > 0,
        temperature=float(temperature),
    )
    return loss_of_logprobs(
        stats.logprobs,
        batch,
        cfg,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        k=k,
        first=first,
        reweight=reweight,
        entropy=stats.entropy,
    )


def _token_stats(params, model_config, batch: RLBatch, pack_rows: int | None,
                 pack: PackMode, **kw):  # fmt: skip
    """TokenStats [B,N,T] of batch.tokens: padded (pack_rows None) or packed in R rows
    (per batch shard with pack BATCH, else per group)."""
    if pack_rows is None:
        return forward.completion_logprobs(
            params, model_config, batch.prompts, batch.prompt_mask, batch.tokens, **kw
        )
    packed_logprobs = (
        batch_packing.packed_logprobs if pack is PackMode.BATCH else packing.packed_logprobs
    )
    return packed_logprobs(
        params,
        model_config,
        batch.prompts,
        batch.prompt_mask,
        batch.tokens,
        batch.mask,
        rows=pack_rows,
        **kw,
    )


def loss_of_logprobs(
    logp: jax.Array,
    batch: RLBatch,
    cfg: StepConfig,
    *,
    old_logprobs: jax.Array | None = None,
    ref_logprobs: jax.Array | None = None,
    k: jax.Array | int | None = None,
    first: jax.Array | bool = True,
    reweight: Reweight | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """loss_fn after the forward: the loss of the policy whose token log-probs of
    batch.tokens are logp [B,N,T] (differentiated), entropy [B,N,T] its token entropies
    (read when cfg.entropy_coef > 0). Every other argument is loss_fn's; the exactness
    tests differentiate this through tabular policies.
    """
    exact_lag = cfg.lag_correction is LagCorrection.EXACT
    if cfg.needs_old_logprobs and old_logprobs is None:
        raise ValueError(
            f"loss_fn: rl.loss={cfg.loss.name} / rl.tis_cap={cfg.tis_cap!r} needs "
            "old_logprobs [B,N,T] (the step's starting policy)."
        )
    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("loss_fn: rl.kl_coef > 0 needs ref_logprobs [B,N,T].")
    # Under EXACT the others' ratios (reweight) are against the behaviour policy mu that
    # drew the rollout, whose log-probs the batch carries; otherwise against the step's start.
    ratio_base = batch.sampler_logprobs if exact_lag else old_logprobs
    if reweight is not None and (k is None or ratio_base is None):
        raise ValueError("loss_fn: `reweight` needs k and old_logprobs.")
    agg = dict(aggregation=cfg.aggregation, max_len=batch.tokens.shape[-1])
    metrics = {}
    is_w = None
    if cfg.tis_cap is not None:
        is_w, metrics = losses.truncated_importance_weights(
            old_logprobs, batch.sampler_logprobs, batch.mask, cfg.tis_cap, cfg.ratio_level
        )
    adv = batch.advantages
    if reweight is not None or exact_lag:  # the policy has moved since sampling
        log_ratio = jax.lax.stop_gradient(
            losses.sequence_logprob(logp, batch.mask)
            - losses.sequence_logprob(ratio_base, batch.mask)
        )
    if reweight is not None:
        again = reweight(batch.scores, log_ratio, k).astype(adv.dtype)
        adv = again if exact_lag else jnp.where(first, adv, again)
    if exact_lag:
        # Sample i's own weight: PG takes the whole rho_i = pi_theta / mu; PPO (decoupled,
        # Hilton et al. 2021) takes pi_start / mu and its clipped ratio pi_theta / pi_start
        # supplies the rest, so where the clip does not bind (always on a step's first
        # update, pi_theta = pi_start) the gradient is rho_i A_i grad log pi. In log space:
        # exp(log w) overflows at 88.7 and inf * 0 = nan (importance_weighted_advantages).
        log_w = log_ratio
        if cfg.loss is PolicyLoss.PPO:
            log_w = jax.lax.stop_gradient(
                losses.sequence_logprob(old_logprobs, batch.mask)
                - losses.sequence_logprob(batch.sampler_logprobs, batch.mask)
            )
        adv, capped = losses.importance_weighted_advantages(log_w, adv)
        metrics["lag_log_ratio_max"] = jnp.max(log_ratio)
        metrics["lag_weight_capped_fraction"] = jnp.mean(capped)
    if cfg.loss is PolicyLoss.PPO:
        loss, m = losses.ppo_clip_loss(
            logp,
            old_logprobs,
            adv,
            batch.mask,
            **agg,
            epsilon=cfg.ppo_epsilon,
            dual_clip=cfg.dual_clip,
            is_weights=is_w,
            ratio_level=cfg.ratio_level,
        )
    else:
        loss, m = losses.policy_gradient_loss(logp, adv, batch.mask, **agg, is_weights=is_w)
    metrics.update(m)
    if cfg.kl_coef > 0:
        kl, m = losses.kl_penalty_loss(logp, ref_logprobs, batch.mask, cfg.kl_estimator, **agg)
        loss, metrics = loss + cfg.kl_coef * kl, {**metrics, **m}
    if cfg.entropy_coef > 0:
        ent, m = losses.entropy_loss(entropy, batch.mask, **agg)
        loss, metrics = loss + cfg.entropy_coef * ent, {**metrics, **m}
    metrics["loss"] = loss
    return loss, metrics


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"`temperature` must be a static float > 0; got {temperature!r}.")
    if not temperature > 0:
        raise ValueError(
            f"`temperature` must be > 0 (the sampling temperature); got {temperature}."
        )
    return float(temperature)


def _accumulated_grads(grad_fn, params, minibatch, microbatches: int, split_spec):
    """(grads averaged over the minibatch's microbatches, per-microbatch metrics [M, ...]).

    grad_fn(params, micro) -> (grads, metrics), micro one of the minibatch's microbatches
    (the minibatch pytree split by _split)."""

    def accumulate(grads_sum, micro):
        grads, metrics = grad_fn(params, micro)
        return jax.tree.map(jnp.add, grads_sum, grads), metrics

    zero_grads = jax.tree.map(jnp.zeros_like, params)
    micros = _split(minibatch, microbatches, split_spec)
    grads, metrics = jax.lax.scan(accumulate, zero_grads, micros)
    return jax.tree.map(lambda g: g / microbatches, grads), metrics


def make_train_step(
    model_config: LlamaConfig,
    cfg: StepConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state_shardings: TrainState,
    *,
    dtype=jnp.float32,
    reweight: Reweight | None = None,
    temperature: float = 1.0,
):
    """Returns step(state, batch, ref_params, k) -> (state, metrics), one jax.jit.

    Args:
      model_config: the policy's LlamaConfig (static).
      cfg: StepConfig (validated: PG makes exactly one update).
      optimizer: optax transformation (kjax.rl.optim.make_optimizer).
      mesh: B is sharded over the batch rule's mesh axes (kjax.sharding.RULES).
      state_shardings: TrainState of NamedShardings (init_train_state's output shardings).
      dtype: the model's compute dtype (ModelConfig.compute_dtype).
      reweight: required iff cfg.offpolicy_max_at_k is not OFF; called inside the jit for
        every update after the first to replace the batch's advantages.
      temperature: static float > 0, the sampling temperature of the rollouts. Every
        log-prob of the update (policy, PPO's old policy, the KL reference) is that of
        softmax(logits / temperature), the distribution the samples came from, so the
        score function, the ratios and the TIS weights are those of the sampled policy.

    The returned step takes state (donated), batch (RLBatch, B divisible by
    minibatches * microbatches * batch devices), ref_params (frozen reference params,
    or None when cfg.kl_coef == 0) and k ([] int32, traced: only `reweight` reads it, so
    a k schedule compiles the step once). Update u (epoch e, minibatch m) minimises
    `loss_fn` (its docstring has the formula) with first = (u == 0):
      loss_u = surrogate(logp, A_u) + kl_coef * KL + entropy_coef * (-H)
    where A_0 = batch advantages and, with reweight, A_u = reweight(scores, log_ratio, k)
    for u > 0; its gradient is the mean of loss_fn's over the minibatch's microbatches,
    and old / reference log-probs are computed once per step, before the first update.
    Metrics: scalar means over updates, plus `finite`.

    With cfg.pack=GROUP the returned step is a kjax.rl.packing.PackedStep: the same call,
    which reads the batch's mask to pick the packed rows R per group (a static argument
    of the jitted step, one compilation per bucket) and runs every forward (update, old
    and reference log-probs) on the packed completions: the same update to float rounding.
    With cfg.pack=BATCH it is a kjax.rl.batch_packing.BatchPackedStep: R rows per batch
    shard of each microbatch, the groups' rows end to end (the same update again).
    """
    if cfg.lag_correction is LagCorrection.EXACT:
        pass  # reweight is None exactly for MEAN (kjax.rl.objective.offpolicy_reweighter)
    elif (reweight is None) != (cfg.offpolicy_max_at_k is OffPolicyMaxAtK.OFF):
        raise ValueError(
            "`reweight` must be given exactly when rl.offpolicy_max_at_k is not OFF "
            f"(it is {cfg.offpolicy_max_at_k.name}); build it with "
            "kjax.rl.objective.offpolicy_reweighter."
        )
    batch_axes = sharding.RULES["batch"]
    batch_sh = NamedSharding(mesh, P(batch_axes))
    split_spec = NamedSharding(mesh, P(None, batch_axes))
    replicated = NamedSharding(mesh, P())
    chunks = cfg.minibatches * cfg.microbatches
    temperature = _check_temperature(temperature)
    step_loss = functools.partial(
        loss_fn,
        cfg=cfg,
        model_config=model_config,
        reweight=reweight,
        dtype=dtype,
        temperature=temperature,
    )

    def frozen_logprobs(params, batch, rows):
        """[B,N,T] log-probs under params held fixed, chunked like the updates."""

        def chunk_logprobs(b):
            return _token_stats(
                params, model_config, b, rows, cfg.pack, dtype=dtype, temperature=temperature
            ).logprobs

        out = jax.lax.map(chunk_logprobs, _split(batch, chunks, split_spec))
        return jax.lax.stop_gradient(_merge(out, batch_sh))

    def step(state: TrainState, batch: RLBatch, ref_params, k, rows: int | None = None):
        # Under the mesh, the forward pins its activations' B to the batch axes
        # (sharding.constrain_batch); a no-op on one device.
        # rl.sequence_parallel: the forward's residual stream split over tensor.
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            sharding.sequence_split(cfg.sequence_parallel),
        ):
            return sharded_step(state, batch, ref_params, k, rows)

    def sharded_step(state: TrainState, batch: RLBatch, ref_params, k, rows):
        B = batch.prompts.shape[0]
        if B % chunks:
            raise ValueError(
                f"B={B} prompts must divide into rl.minibatches * rl.microbatches = {chunks}."
            )
        zeros = jnp.zeros(batch.tokens.shape, jnp.float32)
        old = frozen_logprobs(state.params, batch, rows) if cfg.needs_old_logprobs else zeros
        ref = frozen_logprobs(ref_params, batch, rows) if cfg.kl_coef > 0 else zeros
        minis = _split((batch, old, ref), cfg.minibatches, split_spec)

        # Under LoRA only the adapters are differentiated and optimized: the frozen base
        # enters the loss as a constant, so neither its gradient nor Adam moments exist.
        trainable, frozen = lora.split(state.params)

        def update(carry, xs):
            """One optimizer update on minibatch m of epoch e."""
            (params, opt_state), (minibatch, first) = carry, xs

            def micro_loss(p, micro):
                mb, old_lp, ref_lp = micro
                p = lora.join(p, frozen)
                return step_loss(
                    p,
                    mb,
                    old_logprobs=old_lp,
                    ref_logprobs=ref_lp,
                    k=k,
                    first=first,
                    pack_rows=rows,
                )

            grad_fn = jax.grad(micro_loss, has_aux=True)
            grads, metrics = _accumulated_grads(
                grad_fn, params, minibatch, cfg.microbatches, split_spec
            )
            updates, opt_state = optimizer.update(grads, opt_state, params)
            metrics = {**jax.tree.map(jnp.mean, metrics), "grad_norm": optax.tree.norm(grads)}
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, e):
            firsts = (e == 0) & (jnp.arange(cfg.minibatches) == 0)
            return jax.lax.scan(update, carry, (minis, firsts))

        carry = (trainable, state.opt_state)
        carry, metrics = jax.lax.scan(epoch, carry, jnp.arange(cfg.epochs))
        per_update = jax.tree.map(lambda x: x.reshape(-1), metrics)  # [epochs * minibatches]
        out = {name: jnp.mean(v) for name, v in per_update.items()}
        out["finite"] = jnp.all(jnp.isfinite(per_update["loss"])) & jnp.all(
            jnp.isfinite(per_update["grad_norm"])
        )
        out["reward_mean"] = jnp.mean(batch.scores)
        params, opt_state = carry
        params = lora.join(params, frozen)
        return TrainState(params, opt_state, state.step + 1, state.rng), out

    batch_shardings = RLBatch(*([batch_sh] * len(RLBatch._fields)))
    ref_sh = state_shardings.params if cfg.kl_coef > 0 else None
    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, batch_shardings, ref_sh, replicated),
        out_shardings=(state_shardings, replicated),
        static_argnums=(4,),  # rows (pjit refuses keyword arguments)
        donate_argnums=(0,),
    )
    # rl.pack=GROUP: R packed rows per group, sized per call from the batch's mask;
    # BATCH: R rows per batch shard of a microbatch, from the same mask.
    if cfg.pack is PackMode.BATCH:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            shards = sharding.batch_shards()  # as the traced step sees it
        return batch_packing.BatchPackedStep(jitted, chunks, shards)
    return packing.PackedStep(jitted) if cfg.pack is PackMode.GROUP else jitted


def optimizer_shardings(optimizer: optax.GradientTransformation, params, mesh: Mesh):
    """NamedShardings of optimizer.init of params' trainable part (lora.split): a leaf
    shaped like a parameter, at a path ending in that parameter's path (Adam's
    mu['layers']['q'] and params['layers']['q']), is laid out like it; anything else
    (step counts) is replicated.

    `jax.jit(optimizer.init)` alone replicated every moment on every device (zeros have
    no input to take a layout from): 4 bytes a parameter per chip in bfloat16.
    """
    replicated = NamedSharding(mesh, P())
    params = lora.split(params)[0]
    by_path = {
        jax.tree_util.keystr(path): x for path, x in jax.tree_util.tree_leaves_with_path(params)
    }

    def one(path, leaf):
        key = jax.tree_util.keystr(path)
        matches = [p for p, x in by_path.items() if key.endswith(p) and x.shape == leaf.shape]
        return by_path[max(matches, key=len)].sharding if matches else replicated

    abstract = jax.eval_shape(optimizer.init, params)
    return jax.tree_util.tree_map_with_path(one, abstract)


def init_train_state(
    params, optimizer: optax.GradientTransformation, key: jax.Array, mesh: Mesh
) -> TrainState:
    """A TrainState on `mesh`: params as given (already sharded), optimizer state of their
    trainable part (lora.split) sharded like the params it mirrors (optimizer_shardings),
    step 0, key data of `key`; scalars replicated."""
    out = optimizer_shardings(optimizer, params, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=out)(lora.split(params)[0])
    replicated = NamedSharding(mesh, P())

    def place(x):
        on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        return x if on_mesh else jax.device_put(x, replicated)

    state = TrainState(params, opt_state, jnp.int32(0), jax.random.key_data(key))
    return jax.tree.map(place, state)


def shardings_of(tree):
    """The NamedSharding of every array of a pytree (e.g. init_train_state's output)."""
    return jax.tree.map(lambda x: x.sharding, tree)
