"""SFT warm start: cross-entropy (or DCO) on prompt + reference answer, before RL.

A jitted, sharded step over right-padded [B, L] sequences whose loss mask covers the
answer tokens; `warm_start` runs it and caches the params in a directory keyed by the
configuration, so several RL runs (quickstart's mean and pass@k) share one SFT.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import checkpoint, sharding
from kjax.data import loader
from kjax.models import llama
from kjax.models.config import LlamaConfig
from kjax.rl import losses
from kjax.rl.config import SFTConfig, SFTLoss
from kjax.rl.train_step import TrainState, init_train_state, shardings_of


def sft_loss(params, config: LlamaConfig, tokens, attn, loss_mask, cfg: SFTConfig, dtype):
    """(loss, metrics) of tokens [B,L] int32 with attn [B,L] bool (real tokens) and
    loss_mask [B,L] bool (True on the tokens to predict: the answer and its stop token)."""
    logits = llama.forward(params, config, tokens, attention_mask=attn, dtype=dtype)[:, :-1]
    targets, mask = tokens[:, 1:], loss_mask[:, 1:]
    if cfg.loss is SFTLoss.DCO:
        return losses.dco_loss(logits, targets, mask, cfg.dco_n)
    return losses.cross_entropy_loss(logits, targets, mask)


def make_sft_step(
    config: LlamaConfig, cfg: SFTConfig, optimizer, mesh, state_shardings, dtype=jnp.float32
):
    """step(state, tokens, attn, loss_mask) -> (state, metrics); state donated."""
    batch_sh = NamedSharding(mesh, P(sharding.RULES["batch"]))

    def step(state: TrainState, tokens, attn, loss_mask):
        grad_fn = jax.value_and_grad(sft_loss, has_aux=True)
        (loss, metrics), grads = grad_fn(state.params, config, tokens, attn, loss_mask, cfg, dtype)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, opt_state, state.step + 1, state.rng), metrics

    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_sh, batch_sh, batch_sh),
        out_shardings=(state_shardings, NamedSharding(mesh, P())),
        donate_argnums=(0,),
    )


def sequences(task, examples, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded prompt + answer: (tokens, attn, loss_mask), each [B, length]."""
    rows = [(task.prompt_ids(e), task.target_ids(e)) for e in examples]
    L = length  # fixed, so the step never retraces
    if max(len(p) + len(a) for p, a in rows) > L:
        raise ValueError(f"an SFT example is longer than prompt + max_new_tokens = {L} tokens.")
    tokens = np.zeros((len(rows), L), np.int32)
    attn = np.zeros((len(rows), L), bool)
    loss_mask = np.zeros((len(rows), L), bool)
    for r, (p, a) in enumerate(rows):
        tokens[r, : len(p) + len(a)] = p + a
        attn[r, : len(p) + len(a)] = True
        loss_mask[r, len(p) : len(p) + len(a)] = True
    return tokens, attn, loss_mask


def is_cached(cache_dir, identity: dict, steps: int) -> bool:
    """Whether cache_dir holds the finished warm start of `identity` (claimed: written
    only once its params were saved at `steps`)."""
    path = pathlib.Path(cache_dir) / "experiment.json"
    if not path.exists():
        return False
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False  # warm_start names the broken file
    if stored != json.loads(json.dumps(identity, default=str)):
        return False
    ckpt = pathlib.Path(cache_dir) / "params"
    return ckpt.is_dir() and str(steps) in {p.name for p in ckpt.iterdir()}


def warm_start(
    params,
    model_config: LlamaConfig,
    task,
    cfg: SFTConfig,
    mesh,
    cache_dir,
    identity: dict,
    seed: int,
    completion_len: int,
    dtype=jnp.float32,
    log=print,
):
    """params after cfg.steps SFT steps (constant lr after a short warmup), cached.

    The cache directory refuses a different identity (model, task, SFT config), so a
    stale warm start is never reused silently; it is claimed once it holds the warm start,
    so an SFT that fails leaves it free for the corrected config.
    """
    if cfg.steps == 0:
        return params
    directory = checkpoint.ensure_workdir(cache_dir, identity, claim=False)
    ckpt = checkpoint.Checkpointer(
        directory / "params", checkpoint.CheckpointConfig(every=1, keep=1, async_save=False)
    )
    if ckpt.latest_step() == cfg.steps:
        restored, _ = ckpt.restore({"params": params})
        log(f"sft: reusing the warm start cached in {directory}")
        checkpoint.ensure_workdir(cache_dir, identity)
        return restored["params"]
    schedule = optax.warmup_constant_schedule(0.0, cfg.learning_rate, min(20, cfg.steps))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
    state = init_train_state(params, optimizer, jax.random.key(seed), mesh)
    step = make_sft_step(model_config, cfg, optimizer, mesh, shardings_of(state), dtype)
    batches = loader.batches(
        task.train, loader.LoaderConfig(cfg.batch_size, seed=seed), num_epochs=None
    )
    for i in range(cfg.steps):
        _, examples = next(batches)
        state, metrics = step(state, *sequences(task, examples, task.prompt_len + completion_len))
        if (i + 1) % max(1, cfg.steps // 5) == 0 or i + 1 == cfg.steps:
            m = jax.device_get(metrics)
            log(f"sft step {i + 1}/{cfg.steps}: loss {float(m['loss']):.4f}")
            if not np.isfinite(float(m["loss"])):
                raise FloatingPointError(
                    f"sft loss is {float(m['loss'])} at step {i + 1}; lower sft.learning_rate."
                )
    ckpt.save(cfg.steps, {"params": state.params}, {"steps": cfg.steps}, force=True)
    ckpt.wait()
    ckpt.close()
    checkpoint.ensure_workdir(cache_dir, identity)  # claimed once it holds the warm start
    return state.params
