"""The host loop: sample on device -> detokenize -> verify -> advantages -> update -> log.

`train_and_evaluate(cfg, workdir)` is the whole run (experiments.train is its CLI). It
resumes from the newest complete checkpoint in workdir; the sampling key of step t is
fold_in(base key, t) and the data position is checkpointed, so a resumed run repeats
exactly what an uninterrupted one does.
"""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import checkpoint, evaluation, sharding
from kjax.data import loader
from kjax.models import Llama, LlamaConfig
from kjax.rewards.verdict import Verdicts
from kjax.rl import sft
from kjax.rl.config import DType, ModelKind, TrainConfig, to_json
from kjax.rl.objective import compute_advantages
from kjax.rl.optim import make_optimizer
from kjax.rl.task import CharTokenizer, load_task
from kjax.rl.train_step import RLBatch, init_train_state, make_train_step, shardings_of
from kjax.sampling import sample_params

_EVAL_STREAM = 2**31 - 1  # fold_in constant of the evaluation key (fixed across evals)
_MAX_REFILLS = 4  # dynamic sampling draws at most this many prompt batches per step


def fill_batch(candidates: list[dict], size: int, dynamic: bool) -> tuple[dict, int]:
    """The step's batch of `size` groups from rollout batches drawn in order, and how many
    of them are informative (some advantage != 0). With `dynamic`, informative groups come
    first (DAPO's dynamic sampling); uninformative ones only fill what refills could not.

    candidates: dicts of host arrays with leading axis B_j, each holding "advantages" [B_j, N].
    """
    informative = [np.any(c["advantages"] != 0, axis=1) for c in candidates]
    if not dynamic:
        informative = [np.ones_like(m) for m in informative]
    parts = [(c, m) for c, m in zip(candidates, informative, strict=True)]
    parts += [(c, ~m) for c, m in zip(candidates, informative, strict=True)]
    batch = {n: np.concatenate([c[n][m] for c, m in parts])[:size] for n in candidates[0]}
    return batch, min(size, int(sum(m.sum() for m in informative)))


def maybe_initialize_distributed() -> None:
    """jax.distributed.initialize() when JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID are set (CPU processes talk over gloo)."""
    if "JAX_COORDINATOR_ADDRESS" in os.environ and not jax.distributed.is_initialized():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )


def build_model(cfg: TrainConfig, mesh):
    """(LlamaConfig, params on mesh, tokenizer or None for the character tokenizer)."""
    m = cfg.model
    dtype = jnp.bfloat16 if m.dtype is DType.BFLOAT16 else jnp.float32
    if m.kind is ModelKind.TINY:
        config = LlamaConfig(
            vocab_size=CharTokenizer.vocab_size, hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size, num_layers=m.num_layers,
            num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
            head_dim=m.hidden_size // m.num_heads, tie_embeddings=True,
            bos_id=CharTokenizer.bos_id, eos_ids=(CharTokenizer.eos_id,),
            max_position_embeddings=256,
        )  # fmt: skip
        make = lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(cfg.seed)))  # noqa: E731
        return config, sharding.create_sharded(make, mesh).params(), None
    if m.kind is ModelKind.PRETRAINED:
        from kjax.models import pretrained

        model, tokenizer = pretrained(m.name, mesh=mesh, dtype=dtype)
    else:
        from kjax import tokenizer as tokenizer_lib
        from kjax.models import load

        model, tokenizer = load(m.path, mesh=mesh, dtype=dtype), tokenizer_lib.load(m.path)
    return model.config, model.params(), tokenizer


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def put(x: np.ndarray, sh: NamedSharding) -> jax.Array:
    """A host array (the same on every host) as a global array sharded by `sh`."""
    return jax.make_array_from_callback(x.shape, sh, lambda index: x[index])


class Run:
    """The pieces of one run, built once; methods are the loop's stages."""

    def __init__(self, cfg: TrainConfig, workdir, log=print):
        maybe_initialize_distributed()
        self.cfg = cfg.validate(jax.device_count())
        self.log = log if jax.process_index() == 0 else (lambda *a, **k: None)
        if jax.process_index() == 0:  # one writer of experiment.json, then all hosts check it
            checkpoint.ensure_workdir(workdir, to_json(cfg))
        _barrier("workdir")
        self.workdir = checkpoint.ensure_workdir(workdir, to_json(cfg))
        m = cfg.mesh
        self.mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor)
        self.batch_sh = NamedSharding(self.mesh, P(sharding.RULES["batch"]))
        self.dtype = jnp.bfloat16 if cfg.model.dtype is DType.BFLOAT16 else jnp.float32
        self.model_config, params, tokenizer = build_model(cfg, self.mesh)
        if jax.process_index() == 0:  # prepare the dataset once, then every host reads it
            load_task(cfg, tokenizer, self.workdir / "data")
        _barrier("data")
        self.task = load_task(cfg, tokenizer, self.workdir / "data")
        sft_dir = cfg.sft.cache_dir or self.workdir / "sft"
        identity = {"model": to_json(cfg.model), "task": to_json(cfg.task),
                    "sft": {**to_json(cfg.sft), "cache_dir": ""}, "seed": cfg.seed}  # fmt: skip
        if cfg.sft.steps and jax.process_index() == 0:  # as for the workdir: one writer
            checkpoint.ensure_workdir(sft_dir, identity)
        _barrier("sft")
        params = sft.warm_start(params, self.model_config, self.task, cfg.sft, self.mesh,
                                sft_dir, identity, cfg.seed, cfg.max_new_tokens,
                                self.dtype, self.log)  # fmt: skip
        self.ref_params = jax.tree.map(jnp.copy, params) if cfg.rl.kl_coef > 0 else None
        optimizer = make_optimizer(cfg.optimizer)
        self.state = init_train_state(params, optimizer, jax.random.key(cfg.seed), self.mesh)
        self.step_fn = make_train_step(
            self.model_config,
            cfg.rl,
            cfg.objective,
            optimizer,
            self.mesh,
            shardings_of(self.state),
            dtype=self.dtype,
        )
        self.base_key = jax.random.key(cfg.seed)
        self.sampler = functools.partial(
            sample_params, config=self.model_config, max_new_tokens=cfg.max_new_tokens,
            stop_ids=self.task.stop_ids, dtype=self.dtype,
        )  # fmt: skip
        self.advantages = jax.jit(compute_advantages, static_argnums=(0, 1))

    def rollout(self, params, examples, key, n: int, temperature: float, pool=None):
        """Samples n per prompt and verifies: (prompts, prompt_mask, Rollouts, Verdicts,
        seconds spent (sampling incl. transfer, detokenizing + verifying))."""
        t0 = time.perf_counter()
        prompts, mask = self.task.prompt_batch(examples)
        gp, gm = put(prompts, self.batch_sh), put(mask, self.batch_sh)
        ro = self.sampler(params, gp, gm, key, jnp.float32(temperature), n=n)
        tokens, tmask = evaluation.to_host(ro.tokens), evaluation.to_host(ro.mask)
        t1 = time.perf_counter()
        rows = self.local_rows(len(examples))  # each host verifies only its own prompts
        local = self.task.verify(self.task.decode(tokens[rows], tmask[rows]),
                                 [examples[i] for i in rows], pool)  # fmt: skip
        verdicts = self._share(local, rows, len(examples))
        return prompts, mask, ro, verdicts, (t1 - t0, time.perf_counter() - t1)

    def local_rows(self, b: int) -> np.ndarray:
        """Rows of a [b, ...] batch that live on this host's devices (all of them on one)."""
        index_map = self.batch_sh.addressable_devices_indices_map((b,))
        return np.unique(np.concatenate([np.arange(b)[i] for i in index_map.values()]))

    def _share(self, local: Verdicts, rows: np.ndarray, b: int) -> Verdicts:
        """Every host's verdicts for its rows -> the whole batch's, on every host."""
        if jax.process_count() == 1:
            return local
        full = []
        for x in (local.scores, local.answer_ids, local.target):
            whole = np.zeros((b, *x.shape[1:]), x.dtype)
            whole[rows] = x  # only these rows are read by `put` on this host
            full.append(evaluation.to_host(put(whole, self.batch_sh)))
        return Verdicts(*full)

    def evaluate(self, params, pool=None) -> dict[str, float]:
        key = jax.random.fold_in(self.base_key, _EVAL_STREAM)
        _, _, _, verdicts, _ = self.rollout(params, self.task.test, key, self.cfg.eval.n_eval,
                                    self.cfg.eval.temperature, pool)  # fmt: skip
        return {f"eval/{k}": v for k, v in evaluation.group_metrics(verdicts).items()}


def _tensorboard(workdir):
    """A tensorboardX writer of event files under workdir/tensorboard (None without it)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(workdir / "tensorboard"))


def _k_at(cfg: TrainConfig, step: int) -> int:
    return cfg.k_schedule(step) if cfg.k_schedule is not None else cfg.objective.k


def train_and_evaluate(cfg: TrainConfig, workdir, *, log=print, progress: bool = True,
                       inject_nan_at_step: int | None = None) -> dict:  # fmt: skip
    """Runs (or resumes) the experiment in workdir; returns the last evaluation's metrics.

    inject_nan_at_step: fault injection for tests (NaN advantages at that step).
    """
    from tqdm.auto import tqdm

    run = Run(cfg, workdir, log)
    wd = run.workdir
    ckpt = checkpoint.Checkpointer(wd / "checkpoints", cfg.checkpoint)
    position = loader.Position()
    if ckpt.latest_step() is not None:
        run.state, meta = ckpt.restore(run.state)
        position = loader.Position(**meta["position"])
        log(f"resumed from step {int(run.state.step)} in {wd}")
    start = int(run.state.step)
    metrics_path = wd / "metrics.jsonl"
    records = [r for r in evaluation.read_jsonl(metrics_path) if r["step"] <= start]
    write = jax.process_index() == 0
    if write:  # drop rows of steps past the checkpoint: they are about to be redone
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in records))

    tb = _tensorboard(wd) if write else None

    def emit(row):
        records.append(row)
        if write:
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if tb is not None:
            for name, value in row.items():
                if name != "step" and isinstance(value, int | float):
                    tb.add_scalar(name, value, row["step"])
            tb.flush()

    pool = None
    if cfg.verifier_workers:
        from kjax.rewards.pool import PoolConfig, VerifierPool

        pool = VerifierPool(PoolConfig(workers=cfg.verifier_workers))
    data = loader.LoaderConfig(cfg.batch_prompts, seed=cfg.seed)
    batches = loader.batches(run.task.train, data, start=position, num_epochs=None)
    last_eval = {}
    if start == 0:
        last_eval = run.evaluate(run.state.params, pool)
        emit({"step": 0, **last_eval})
    bar = tqdm(total=cfg.steps, initial=start, disable=not (progress and write), desc=cfg.name)
    try:
        for step in range(start, cfg.steps):
            row, position = rl_step(run, step, batches, position, pool, inject_nan_at_step)
            if not row["finite"]:
                ckpt.wait()
                raise FloatingPointError(
                    f"loss or gradient is not finite at RL step {step} (loss={row['loss']}, "
                    f"grad_norm={row['grad_norm']}); stopped without saving. The last good "
                    f"checkpoint is step {ckpt.latest_step()} in {ckpt.directory}."
                )
            if (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps:
                last_eval = run.evaluate(run.state.params, pool)
                row.update(last_eval)
            emit(row)
            bar.update(1)
            bar.set_postfix(
                reward=f"{row['reward_mean']:.3f}",
                **{
                    k.split("/")[1]: f"{v:.3f}"
                    for k, v in last_eval.items()
                    if k in ("eval/pass@1", f"eval/pass@{cfg.eval.n_eval}")
                },
            )
            meta = {"position": {"epoch": position.epoch, "batch": position.batch}}
            ckpt.save(step + 1, run.state, meta, force=step + 1 == cfg.steps)
        ckpt.wait()
    finally:
        bar.close()
        ckpt.close()
        if tb is not None:
            tb.close()
        if pool is not None:
            pool.close()
    if write:
        evaluation.plot(records, wd, title=cfg.name)
    return last_eval or {k: v for k, v in records[-1].items() if k.startswith("eval/")}


def rl_step(run: Run, step: int, batches, position, pool, nan_step):
    """One RL step; returns (JSON-able metrics row, data position after it)."""
    cfg = run.cfg
    k = _k_at(cfg, step)
    t0 = time.perf_counter()
    key = jax.random.fold_in(run.base_key, step)
    timing = {"sample": 0.0, "verify": 0.0, "advantages": 0.0}
    candidates, attempts = [], 0
    while True:  # dynamic sampling: refill dropped groups from the next prompts
        position, examples = next(batches)
        prompts, pmask, ro, v, (t_sample, t_verify) = run.rollout(
            run.state.params, examples, jax.random.fold_in(key, attempts), cfg.samples,
            cfg.temperature, pool)  # fmt: skip
        timing["sample"] += t_sample
        timing["verify"] += t_verify
        t = time.perf_counter()
        adv = np.asarray(
            run.advantages(
                cfg.objective,
                k,
                jnp.asarray(v.scores),
                jnp.asarray(v.answer_ids),
                jnp.asarray(v.target),
            )
        )
        timing["advantages"] += time.perf_counter() - t
        host = dict(prompts=prompts, prompt_mask=pmask, tokens=evaluation.to_host(ro.tokens),
                    mask=evaluation.to_host(ro.mask),
                    sampler_logprobs=evaluation.to_host(ro.logprobs), scores=v.scores,
                    advantages=adv)  # fmt: skip
        candidates.append(host)
        attempts += 1
        batch, kept = fill_batch(candidates, cfg.batch_prompts, cfg.dynamic_sampling)
        if kept >= cfg.batch_prompts or attempts >= _MAX_REFILLS:
            break
    if nan_step == step:
        batch["advantages"] = batch["advantages"] * np.nan
    batch = RLBatch(**{n: put(a, run.batch_sh) for n, a in batch.items()})
    t = time.perf_counter()
    run.state, metrics = run.step_fn(run.state, batch, run.ref_params, k)
    metrics = {n: float(x) for n, x in jax.device_get(metrics).items()}
    timing["update"] = time.perf_counter() - t
    row = {"step": step + 1, "k": k, **metrics, "finite": bool(metrics["finite"]),
           "kept_fraction": kept / (attempts * cfg.batch_prompts), "sample_batches": attempts,
           **{f"time/{n}": s for n, s in timing.items()},
           "time/step": time.perf_counter() - t0}  # fmt: skip
    return row, position
