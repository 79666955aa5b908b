"""The pieces of one RL run, built once by `build_components` and held in a frozen dataclass.

Nothing here is mutated after construction: the loop (kjax.rl.loop) threads a TrainState
through pure-ish stage functions that read these components.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import checkpoint, sampler_layout, sampling, sharding, writer_lock
from kjax.models import Llama, LlamaConfig, lora
from kjax.rl import multihost, sft
from kjax.rl.config import BonAnchor, EvalSplit, ModelKind, Objective, TrainConfig, to_json
from kjax.rl.metrics_writer import MetricsWriter
from kjax.rl.objective import compute_advantages, offpolicy_reweighter
from kjax.rl.optim import make_optimizer
from kjax.rl.task import Task, load_task, tiny_tokenizer
from kjax.rl.train_step import TrainState, init_train_state, make_train_step, shardings_of
from kjax.sampler_weights import SamplerWeights
from kjax.sampling import sample_params


@dataclasses.dataclass(frozen=True)
class Components:
    """Everything a run reads; built by build_components, closed by close().

    step_fn: (state, RLBatch, ref_params, k) -> (state, metrics) (kjax.rl.train_step).
    sampler: (params, prompts, prompt_mask, key, temperature, n=) -> kjax.sampling.Rollouts.
    advantages: (ObjectiveConfig, k, scores, answer_ids, target, anchor_scores) -> [B, N],
      jitted
      (kjax.rl.objective.compute_advantages; one compile per distinct k).
    ref_params: the frozen KL reference (None without a KL penalty).
    pool: a kjax.rewards.pool.VerifierPool, or None to verify in this process.
    sample_sharding: where the sampler's prompts [B,S] live (batch_sharding, or the
      sampling group's data axis under mesh.sampler_devices).
    to_sampler: params on the training mesh -> the params the sampler reads (the same
      arrays, or a copy resharded onto the sampling group).
    base_id: under LoRA, lora.fingerprint of the frozen base: checkpoints then hold the
      adapters and this identity, never the base (None: full fine-tuning).
    anchor_params: under objective.bon_anchor=REFERENCE, the sampler's copy of ref_params,
      which the loop samples best-of-n's anchors from (None otherwise).
    """

    cfg: TrainConfig
    workdir: pathlib.Path
    mesh: Mesh
    batch_sharding: NamedSharding
    model_config: LlamaConfig
    tokenizer: Any
    task: Task
    optimizer: optax.GradientTransformation
    step_fn: Callable
    sampler: Callable
    advantages: Callable
    ref_params: Any
    checkpointer: checkpoint.Checkpointer
    metrics: MetricsWriter
    pool: Any
    base_key: jax.Array
    log: Callable
    sample_sharding: NamedSharding
    to_sampler: Callable
    lock: Any = None  # the workdir's writer lock (kjax.writer_lock), held until close()
    base_id: str | None = None
    anchor_params: Any = None

    @property
    def overlaps(self) -> bool:
        """Whether step t + policy_lag's sampling runs on other devices than step t's update."""
        return self.cfg.mesh.sampler_devices > 0

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()
        if self.pool is not None:
            self.pool.close()
        if self.lock is not None:
            self.lock.close()


# Fields of a run's identity that say where files are, not what the run is: the warm
# start's cache folder, spelled relative or absolute and moved with a table's workdir.
WHERE = ("sft.cache_dir",)


# One jitted update per distinct (model, update, optimizer, objective, mesh, state layout)
# in this process: runs that differ only in their seed (a table's seeds, one after the
# other) share it, so only the first one traces and compiles the step.
_STEP_CACHE_SIZE = 32


@functools.lru_cache(maxsize=_STEP_CACHE_SIZE)
def _cached_train_step(model_config, rl, opt_cfg, objective, ks, mesh, shardings, treedef, dtype,
                       temperature):  # fmt: skip
    state_shardings = jax.tree.unflatten(treedef, shardings)
    return make_train_step(
        model_config,
        rl,
        make_optimizer(opt_cfg),
        mesh,
        state_shardings,
        dtype=dtype,
        reweight=offpolicy_reweighter(objective, rl, ks),
        temperature=temperature,
    )


# The advantages, jitted once per process (static: the ObjectiveConfig and k).
_advantages = jax.jit(compute_advantages, static_argnums=(0, 1))


def step_and_sampler(
    cfg: TrainConfig, model_config: LlamaConfig, mesh, state, task, sampler_mesh=None
):
    """(the jitted RL update, the grouped sampler) of `model_config` for the run `cfg`.

    The update is shared by every run of this process with the same model, StepConfig,
    OptimizerConfig, objective, mesh and state layout (an in-process cache), so a table's
    seeds compile it once. Its optimizer is make_optimizer(cfg.optimizer). Both use
    cfg.model.attention's backend.
    """
    dtype = cfg.model.compute_dtype
    model_config = dataclasses.replace(model_config, attention=cfg.model.attention)
    shardings, treedef = jax.tree.flatten(shardings_of(state))
    step_fn = _cached_train_step(
        model_config,
        cfg.rl,
        cfg.optimizer,
        cfg.objective,
        tuple(cfg.ks()),
        mesh,
        tuple(shardings),
        treedef,
        jnp.dtype(dtype),
        cfg.temperature,
    )
    stop_ids, T = task.stop_ids, cfg.max_new_tokens
    on = mesh if sampler_mesh is None else sampler_mesh
    weights = sampler_weights(cfg, model_config, on, state)

    def sampler(params, prompts, prompt_mask, key, temperature, *, n: int):
        # Traced under the mesh, the sampler pins its rows (activations, own K/V) to the
        # batch axes (sharding.constrain_batch); a no-op on one device.
        with jax.sharding.use_abstract_mesh(on.abstract_mesh):
            return sample_params(params, prompts, prompt_mask, key, temperature, n=n,
                                 config=model_config, dtype=dtype, max_new_tokens=T,
                                 stop_ids=stop_ids,
                                 compact_floor=cfg.sampler_compact_floor,
                                 weights=weights)  # fmt: skip

    return step_fn, sampler


def sampler_weights(cfg: TrainConfig, model_config: LlamaConfig, mesh, state) -> SamplerWeights:
    """cfg.sampler_weights resolved for `mesh` (kjax.sampler_layout.resolve_weights): AUTO
    by the first device's memory limit (none on a CPU: the trainer's layout), the K/V
    cache of one rollout at config.task.max_prompt_tokens (the model's context when 0),
    and the train state, which stays allocated while the sampler runs."""
    if cfg.sampler_weights is not SamplerWeights.AUTO:
        return cfg.sampler_weights
    try:
        stats = mesh.devices.flat[0].memory_stats() or {}
    except Exception:  # a backend without memory statistics  # noqa: BLE001
        stats = {}
    hbm = stats.get("bytes_limit")
    if not hbm or mesh.shape.get("fsdp", 1) == 1:
        return SamplerWeights.TRAIN
    S = cfg.task.max_prompt_tokens or model_config.max_position_embeddings
    B, N, T = cfg.batch_prompts, cfg.samples, cfg.max_new_tokens
    L, K, E = model_config.num_layers, model_config.num_kv_heads, model_config.head_dim
    item = jnp.dtype(cfg.model.compute_dtype).itemsize
    tpu = mesh.devices.flat[0].platform == "tpu"
    cache = sum(
        2 * sampler_layout.per_chip_bytes(shape, sharding.cache_spec(shape, mesh), mesh, item)
        for shape in ((L, B, S, K, E), (L, B * N, sampling.own_slots(T, tpu), K, E))
    )
    held = sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        for x in jax.tree.leaves(state)
        if hasattr(x, "sharding")
    )
    return sampler_layout.resolve_weights(
        cfg.sampler_weights, state.params, model_config, mesh, cache_bytes=cache,
        resident_bytes=held, hbm_bytes=hbm,
    )  # fmt: skip


def tiny_model_config(cfg: TrainConfig) -> LlamaConfig:
    """The LlamaConfig of a TINY model: cfg.model's sizes over its task's characters."""
    m, chars = cfg.model, tiny_tokenizer(cfg)
    return LlamaConfig(
        vocab_size=chars.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.hidden_size // m.num_heads,
        tie_embeddings=True,
        bos_id=chars.bos_id,
        eos_ids=(chars.eos_id,),
        max_position_embeddings=256,
    )


def build_model(cfg: TrainConfig, mesh: Mesh):
    """(LlamaConfig, params on mesh, tokenizer); a TINY model's is its task's characters."""
    m, dtype = cfg.model, cfg.model.compute_dtype
    if m.kind is ModelKind.TINY:
        chars = tiny_tokenizer(cfg)
        config = tiny_model_config(cfg)
        init = cfg.seed if cfg.sft.seed is None else cfg.sft.seed  # part of the warm start
        make = lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(init)))  # noqa: E731
        return config, sharding.create_sharded(make, mesh).params(), chars
    if m.kind is ModelKind.PRETRAINED:
        from kjax.models import pretrained

        model, tokenizer = pretrained(m.name, mesh=mesh, dtype=dtype)
    else:
        from kjax import tokenizer as tokenizer_lib
        from kjax.models import load

        model, tokenizer = load(m.path, mesh=mesh, dtype=dtype), tokenizer_lib.load(m.path)
    return model.config, model.params(), tokenizer


# Folded into the run's seed for the adapters' initialization, apart from every other draw.
_LORA_STREAM = 0x10A


def attach_lora(cfg: TrainConfig, params):
    """params with fresh LoRA adapters when cfg.model.lora.rank > 0 (after the warm start,
    which trains the whole model), else params; A from the run's seed, B = 0."""
    key = jax.random.fold_in(jax.random.key(cfg.seed), _LORA_STREAM)
    return lora.attach(params, cfg.model.lora, key)


def _sft_identity(cfg: TrainConfig) -> dict:
    """What a cached SFT warm start is (the cache folder refuses any other)."""
    seed = cfg.seed if cfg.sft.seed is None else cfg.sft.seed
    return {
        "model": to_json(cfg.model),
        "task": to_json(cfg.task),
        "sft": {**to_json(cfg.sft), "cache_dir": ""},
        "seed": seed,
    }


def warm_start_cached(cfg: TrainConfig) -> bool:
    """Whether cfg.sft.cache_dir already holds cfg's finished SFT warm start (so building
    a run only to train it would train nothing)."""
    if not (cfg.sft.steps and cfg.sft.cache_dir):
        return False
    return sft.is_cached(cfg.sft.cache_dir, _sft_identity(cfg), cfg.sft.steps)


def _warm_start(cfg: TrainConfig, workdir, params, model_config, task, mesh, log):
    """params after the SFT warm start (cached by identity in cfg.sft.cache_dir)."""
    if not cfg.sft.steps:
        return params
    sft_dir = cfg.sft.cache_dir or workdir / "sft"
    seed = cfg.seed if cfg.sft.seed is None else cfg.sft.seed
    identity = _sft_identity(cfg)
    multihost.leader_first("sft", lambda: checkpoint.ensure_workdir(sft_dir, identity, claim=False))
    return sft.warm_start(
        params,
        model_config,
        task,
        cfg.sft,
        mesh,
        sft_dir,
        identity,
        seed,
        cfg.max_new_tokens,
        cfg.model.compute_dtype,
        log,
    )


def build_components(cfg: TrainConfig, workdir, log=print) -> tuple[Components, TrainState]:
    """Validates cfg, claims workdir, builds every piece of the run and its initial state
    (after the SFT warm start; resuming from a checkpoint is the loop's business)."""
    multihost.maybe_initialize_distributed()
    cfg = cfg.validate(jax.device_count())
    log = log if multihost.is_leader() else (lambda *a, **k: None)
    _warn_lag(cfg, log)
    identity = to_json(cfg)
    # Checked now, claimed once the run is built: a run that fails before it starts (bad
    # data, a task that cannot warm-start) leaves the workdir free for the corrected command.
    workdir = multihost.leader_first(
        "workdir", lambda: checkpoint.ensure_workdir(workdir, identity, where=WHERE, claim=False)
    )
    # One writer per workdir: a second trainer is refused before it builds anything.
    lock = writer_lock.acquire(workdir) if multihost.is_leader() else None
    try:
        return _build(cfg, workdir, log, identity, lock)
    except BaseException:
        if lock is not None:
            lock.close()
        raise


def _build(cfg: TrainConfig, workdir, log, identity, lock) -> tuple[Components, TrainState]:
    mesh, sampler_mesh = meshes(cfg)
    model_config, params, tokenizer = build_model(cfg, mesh)
    task = multihost.leader_first("data", lambda: load_task(cfg, tokenizer, workdir / "data"))
    split = cfg.eval.split
    held_out = task.validation if split is EvalSplit.VALIDATION else task.test
    if len(held_out) < cfg.eval.problems:
        log(
            f"note: eval.problems={cfg.eval.problems} but the {split.value} split has "
            f"{len(held_out)} problems; every evaluation scores those {len(held_out)}."
        )
    params = _warm_start(cfg, workdir, params, model_config, task, mesh, log)
    params = attach_lora(cfg, params)
    base_id = lora.fingerprint(lora.split(params)[1]) if cfg.model.lora.enabled else None
    ref_params = jax.tree.map(jnp.copy, params) if cfg.rl.kl_coef > 0 else None
    reference_anchor = cfg.objective.bon_anchor is BonAnchor.REFERENCE  # validate: kl_coef > 0
    optimizer = make_optimizer(cfg.optimizer)
    state = init_train_state(params, optimizer, jax.random.key(cfg.seed), mesh)
    step_fn, sampler = step_and_sampler(cfg, model_config, mesh, state, task, sampler_mesh)
    multihost.leader_first(
        "claim", lambda: checkpoint.ensure_workdir(workdir, identity, where=WHERE)
    )
    pool = None
    if cfg.verifier_workers:
        from kjax.rewards.pool import PoolConfig, VerifierPool

        pool = VerifierPool(PoolConfig(workers=cfg.verifier_workers))
    components = Components(
        cfg=cfg,
        workdir=workdir,
        mesh=mesh,
        batch_sharding=NamedSharding(mesh, P(sharding.RULES["batch"])),
        model_config=model_config,
        tokenizer=task.tokenizer,
        task=task,
        optimizer=optimizer,
        step_fn=step_fn,
        sampler=sampler,
        advantages=_advantages,
        ref_params=ref_params,
        checkpointer=checkpoint.Checkpointer(workdir / "checkpoints", cfg.checkpoint),
        metrics=MetricsWriter(workdir, write=multihost.is_leader()),
        pool=pool,
        base_key=jax.random.key(cfg.seed),
        log=log,
        sample_sharding=NamedSharding(sampler_mesh or mesh, P(sharding.RULES["batch"])),
        to_sampler=_to_sampler(sampler_mesh),
        lock=lock,
        base_id=base_id,
        anchor_params=_to_sampler(sampler_mesh)(ref_params) if reference_anchor else None,
    )
    return components, state


def meshes(cfg: TrainConfig) -> tuple[Mesh, Mesh | None]:
    """(the training mesh, the sampling group's data-parallel mesh or None): with
    mesh.sampler_devices = s, the first s devices sample and the others train."""
    devices = jax.devices()
    s = cfg.mesh.sampler_devices
    if s and jax.process_count() > 1:
        raise ValueError(
            "`config.mesh.sampler_devices` splits this process's devices into a sampling and "
            "a training group; multi-host runs do not support it yet. Set it to 0."
        )
    train = devices[s:]
    mesh = sharding.make_mesh(*cfg.mesh.resolve(len(train)), devices=train)
    return mesh, (sharding.make_mesh(s, 1, 1, devices=devices[:s]) if s else None)


def _to_sampler(sampler_mesh: Mesh | None) -> Callable:
    """params -> the sampling group's copy (same specs; its fsdp and tensor axes are 1)."""
    if sampler_mesh is None:
        return lambda params: params

    def copy(params):
        return jax.tree.map(
            lambda x: jax.device_put(x, NamedSharding(sampler_mesh, x.sharding.spec)), params
        )

    return copy


def _unweighted_terms(rl) -> str:
    """The penalty and bonus no lag correction weights: estimated on mu's samples, so each
    is the behaviour policy's expectation, not the current one's (docs/async.md)."""
    terms = [
        name
        for name, coef in (("KL penalty", rl.kl_coef), ("entropy bonus", rl.entropy_coef))
        if coef > 0
    ]
    if not terms:
        return ""
    return (
        f"; the {' and '.join(terms)} are NOT importance-weighted (estimated on the stale "
        "samples): biased"
    )


def _warn_lag(cfg: TrainConfig, log) -> None:
    """Says, once per run, what a stale rollout's correction leaves biased (never silently)."""
    rl = cfg.rl
    if not rl.policy_lag:
        return
    how = {
        "NONE": "uses them as if on-policy (no correction): the gradient is biased",
        "TIS": (
            f"weights each token by its own ratio truncated at {rl.tis_cap}: biased (per-token "
            "ratios are not the sequence's, and the cap truncates)"
            + (
                ", and for this k-sample objective even untruncated (the other samples' "
                "ratios are ignored); lag_correction=EXACT is unbiased"
                if cfg.objective.objective is not Objective.MEAN
                else ""
            )
        ),
        "EXACT": (
            "re-weights the objective's gradient exactly (unbiased; untruncated ratios, so "
            "higher variance"
            + (
                "; PPO decoupled: exact where its clip around the step's start does not bind"
                if rl.loss.name == "PPO"
                else ""
            )
            + ")"
        ),
    }[rl.lag_correction.name]
    if rl.lag_correction.name != "NONE":
        how += _unweighted_terms(rl)
    ago = f"{rl.policy_lag} update(s) ago"
    if rl.policy_lag >= cfg.steps:  # said plainly: no rollout is from a trained policy
        ago = (
            f"the initial ones: rl.policy_lag >= steps={cfg.steps}, so no rollout comes from "
            "a trained policy (lower rl.policy_lag, or raise steps, if that is not meant)"
        )
    log(
        f"note: rl.policy_lag={rl.policy_lag}: each rollout comes from the parameters of "
        f"{ago}, and rl.lag_correction={rl.lag_correction.name} {how}."
    )
