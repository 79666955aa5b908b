"""Several seeds of one run in lockstep: every device stage is one jit over a seed axis.

`train_seeds(cfgs, workdirs)` trains S runs whose configs differ only in their seed (and
the warm start's cache folder) as `kjax.rl.loop.train_and_evaluate` would train each of
them, but each step samples, computes advantages and updates all S with one call of one
compiled function, jax.vmap of the run's own sampler, advantages and jitted update over a
leading [S] axis. A small model on a CPU spends most of a step in per-call overhead, so
this is what makes 20-seed tables affordable; compile happens once per config, not once
per seed.

What each seed sees is what its own run sees: its warm start, its data order
(Batches(seed)), its sampling keys (fold_in(key(seed), step), the evaluation's fixed
stream), its optimizer state. Each seed keeps its own workdir exactly as
train_and_evaluate leaves it (metrics.jsonl, checkpoints, plot), so either trainer can
resume the other's runs. Numbers agree with separate runs up to float rounding: XLA may
order a batched matmul's sums differently, and once a sampled token flips the two runs
are different draws of the same experiment (tests/rl/test_seeds.py measures it).

Differences from separate runs:
- time/* in a metrics row are the whole lockstep step's seconds (all seeds), and
  lockstep_seeds says how many seeds shared it.
- A seed whose loss or gradient turns non-finite stops as its own run would (nothing of
  that step is saved; its result is the FloatingPointError) while the others go on.
- Seeds resumed at different steps are trained in groups, one group per resume step.
- Not supported (ValueError naming the field): dynamic_sampling (a seed's refills would
  break the lockstep), verifier_workers > 0, rl.policy_lag > 0, mesh.sampler_devices > 0,
  several processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import evaluation, sharding
from kjax.progress import progress as progress_bar
from kjax.rl import loop
from kjax.rl import task as task_lib
from kjax.rl.components import Components, build_components
from kjax.rl.config import BonAnchor, RewardSource, TrainConfig, to_json
from kjax.rl.objective import compute_advantages
from kjax.rl.train_step import RLBatch, TrainState

__all__ = ["lockstep_identity", "train_seeds", "unsupported"]


def lockstep_identity(cfg: TrainConfig) -> dict:
    """cfg's identity without what may differ between lockstep seeds (seed, name, the
    warm start's cache folder): runs train in lockstep only when these are equal."""
    cfg = dataclasses.replace(cfg, seed=0, name="", sft=dataclasses.replace(cfg.sft, cache_dir=""))
    return to_json(cfg)


def _check(cfgs: Sequence[TrainConfig], workdirs: Sequence) -> None:
    if not cfgs or len(cfgs) != len(workdirs):
        raise ValueError(
            f"train_seeds: give one workdir per config (got {len(cfgs)} configs and "
            f"{len(workdirs)} workdirs), at least one."
        )
    seeds = [c.seed for c in cfgs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"train_seeds: the seeds {seeds} repeat; each run needs its own seed.")
    if len({str(w) for w in workdirs}) != len(workdirs):
        raise ValueError("train_seeds: two runs share a workdir; give each its own.")
    first = lockstep_identity(cfgs[0])
    for cfg in cfgs[1:]:
        other = lockstep_identity(cfg)
        if other != first:
            fields = sorted(f for f in first if first[f] != other.get(f))
            raise ValueError(
                f"train_seeds: the config of seed {cfg.seed} differs from seed {cfgs[0].seed}'s "
                f"in {fields}; lockstep runs may differ only in seed, name and "
                "sft.cache_dir. Train the others with train_and_evaluate or another call."
            )
    reason = unsupported(cfgs[0])
    if reason:
        raise ValueError(f"train_seeds: {reason}")


def unsupported(cfg: TrainConfig) -> str | None:
    """Why runs of cfg cannot train in lockstep (with the fix), or None when they can."""
    if cfg.dynamic_sampling:
        return (
            "dynamic_sampling=true refills each seed's batch a different number of times, "
            "which breaks the lockstep; train it with train_and_evaluate."
        )
    if cfg.verifier_workers:
        return (
            "verifier_workers > 0 is not supported in lockstep; set verifier_workers=0 or "
            "use train_and_evaluate."
        )
    if cfg.rl.policy_lag:
        return (
            "rl.policy_lag > 0 keeps each run's rollouts of the next steps pending, which "
            "the lockstep does not carry; train it with train_and_evaluate."
        )
    if cfg.mesh.sampler_devices:
        return (
            "mesh.sampler_devices > 0 (a separate sampling group) is not supported in "
            "lockstep; set it to 0 or use train_and_evaluate."
        )
    if cfg.objective.bon_anchor is BonAnchor.REFERENCE:
        return (
            "objective.bon_anchor=REFERENCE samples anchors from the fixed reference each "
            "step, which the lockstep does not; train it with train_and_evaluate."
        )
    if jax.process_count() > 1:
        return "it runs in one process; use train_and_evaluate on multihost."
    return None


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@functools.partial(jax.jit, static_argnums=1)
def _unstack(tree, count: int):
    return [jax.tree.map(lambda x, s=s: x[s], tree) for s in range(count)]


@jax.jit
def _fold(keys, data):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, data)


class _Lockstep:
    """The S runs' components and the vmapped, jitted stages shared by all of them."""

    def __init__(self, comps: list[Components]):
        c0 = comps[0]
        self.comps, self.cfg, self.S = comps, c0.cfg, len(comps)
        self.keys = jnp.stack([c.base_key for c in comps])  # [S] typed keys
        self.eval_keys = jnp.stack([loop.eval_key(c) for c in comps])  # fixed across evals
        kl = c0.ref_params is not None
        self.ref = _stack([c.ref_params for c in comps]) if kl else None
        self.update = jax.jit(
            jax.vmap(c0.step_fn, in_axes=(0, 0, 0 if kl else None, None)), donate_argnums=0
        )
        self.sh = NamedSharding(c0.mesh, P(None, sharding.RULES["batch"]))  # [S, B, ...]
        self._samplers: dict[tuple[int, bool], Callable] = {}
        self._advantages: dict[int, Callable] = {}

    def sample(self, params, prompts, pmask, keys, n: int, temperature: float, shared: bool):
        """Rollouts with a leading [S] axis; prompts [S,B,L] or, when `shared`, [B,L]."""
        fn = self._samplers.get((n, shared))
        if fn is None:
            axis = None if shared else 0
            sampler = functools.partial(self.comps[0].sampler, n=n)
            fn = jax.jit(jax.vmap(sampler, in_axes=(0, axis, axis, 0, None)))
            self._samplers[(n, shared)] = fn
        return fn(params, prompts, pmask, keys, jnp.float32(temperature))

    def advantages(self, k: int, scores, answer_ids, target):
        fn = self._advantages.get(k)
        if fn is None:
            fn = jax.jit(jax.vmap(functools.partial(compute_advantages, self.cfg.objective, k)))
            self._advantages[k] = fn
        return fn(scores, answer_ids, target)


def _evaluate(L: _Lockstep, params, alive: Sequence[int]) -> dict[int, dict]:
    """loop.evaluate of every alive seed: {seed index: eval/* metrics}."""
    c0, e = L.comps[0], L.cfg.eval
    problems = loop.eval_problems(c0)
    prompts, pmask = task_lib.prompt_batch(c0.task, problems)
    ro = L.sample(params, prompts, pmask, L.eval_keys, e.n_eval, e.temperature, shared=True)
    tokens, mask = evaluation.to_host(ro.tokens), evaluation.to_host(ro.mask)
    return {
        s: loop.eval_metrics(L.comps[s].cfg, loop.verify(L.comps[s], problems, tokens[s], mask[s]))
        for s in alive
    }


def _step(L: _Lockstep, state: TrainState, step: int, batches, alive) -> tuple:
    """One RL step of all S seeds: (new stacked state, {seed index: metrics row})."""
    cfg, S = L.cfg, L.S
    k = cfg.k_at(step)
    t0 = time.perf_counter()
    examples = [next(b) for b in batches]
    pb = [task_lib.prompt_batch(c.task, ex) for c, ex in zip(L.comps, examples, strict=True)]
    keys = _fold(_fold(L.keys, step), 0)  # loop.rl_step's fold_in(fold_in(key, step), attempt)
    prompts = jax.device_put(np.stack([p for p, _ in pb]), L.sh)
    pmask = jax.device_put(np.stack([m for _, m in pb]), L.sh)
    ro = L.sample(state.params, prompts, pmask, keys, cfg.samples, cfg.temperature, shared=False)
    tokens, mask = evaluation.to_host(ro.tokens), evaluation.to_host(ro.mask)
    t1 = time.perf_counter()
    verdicts = [loop.verify(L.comps[s], examples[s], tokens[s], mask[s]) for s in range(S)]
    t2 = time.perf_counter()
    scores = np.stack([v.scores for v in verdicts])
    answers = np.stack([v.answer_ids for v in verdicts])
    adv = L.advantages(k, scores, answers, np.stack([v.target for v in verdicts]))
    t3 = time.perf_counter()
    batch = RLBatch(  # the rollout stays on device; only the host's verdicts go up
        prompts=prompts,
        prompt_mask=pmask,
        tokens=ro.tokens,
        mask=ro.mask,
        sampler_logprobs=ro.logprobs,
        scores=jax.device_put(scores, L.sh),
        advantages=adv,
    )
    state, metrics = L.update(state, batch, L.ref, np.int32(k))
    metrics = jax.device_get(metrics)
    t4 = time.perf_counter()
    timing = {"sample": t1 - t0, "verify": t2 - t1, "advantages": t3 - t2, "update": t4 - t3}
    timing["step"] = t4 - t0
    rows = {}
    for s in alive:
        c, v = L.comps[s], verdicts[s]
        votes = []
        if cfg.objective.reward is RewardSource.MAJORITY_VOTE:
            votes.append(loop.pseudo_label_stats(c.cfg, v))
        tallies = {name: int(count) for name, count in v.counts.items()}
        m = {name: float(x[s]) for name, x in metrics.items()}
        row = loop.step_row(c.cfg, step, m, cfg.batch_prompts, 1, timing, tallies, votes)
        row.update(loop.token_stats(mask[s], timing["step"]))
        rows[s] = {**row, "lockstep_seeds": len(alive)}
    return state, rows


def _run_group(comps, states, positions, start: int, results, log, progress, timer) -> None:
    """Trains the seeds `comps` (all resumed at `start`) in lockstep to cfg.steps; writes
    each seed's rows and checkpoints; sets results[s] (index into comps) to the last
    evaluation or the FloatingPointError that stopped the seed."""
    with timer("build"):
        L = _Lockstep(comps)
        state = jax.block_until_ready(_stack(states))
    cfg, S = L.cfg, L.S
    batches = [
        loop.Batches(c.task.train, cfg.batch_prompts, c.cfg.seed, p)
        for c, p in zip(comps, positions, strict=True)
    ]
    alive = list(range(S))
    last = {s: {} for s in alive}
    if start == 0:
        with timer("eval"):
            last = _evaluate(L, state.params, alive)
        with timer("io"):
            for s in alive:
                comps[s].metrics.write({"step": 0, **last[s]})
    desc = f"{cfg.name} x{S} seeds"
    with progress_bar(cfg.steps, start, desc, enabled=progress) as bar:
        for step in range(start, cfg.steps):
            with timer("rl_steps"):
                state, rows = _step(L, state, step, batches, alive)
            for s in [s for s in alive if not rows[s]["finite"]]:
                try:
                    loop.finite_or_raise(comps[s], rows.pop(s))
                except FloatingPointError as e:
                    results[s] = e
                    log(f"seed {comps[s].cfg.seed}: {e}")
                alive.remove(s)
            if not alive:
                break
            if (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps:
                with timer("eval"):
                    evals = _evaluate(L, state.params, alive)
                for s in alive:
                    last[s] = evals[s]
                    rows[s].update(evals[s])
            save = (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.steps
            with timer("io"):
                one = _unstack(state, S) if save else None
                for s in alive:
                    comps[s].metrics.write(rows[s])
                    if save:
                        meta = {"position": dataclasses.asdict(batches[s].position)}
                        last_step = step + 1 == cfg.steps
                        comps[s].checkpointer.save(step + 1, one[s], meta, force=last_step)
            s0 = alive[0]
            bar.update(1)
            bar.set_postfix(**loop.postfix(rows[s0], last[s0], cfg.eval.n_eval))
    with timer("io"):
        for s in alive:
            comps[s].checkpointer.wait()
    for s in alive:
        results[s] = last[s] or loop.evals_of(comps[s].metrics.records[-1])


def train_seeds(
    cfgs: Sequence[TrainConfig],
    workdirs: Sequence,
    *,
    log=print,
    progress: bool = True,
    timer: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> list[dict | FloatingPointError]:
    """Trains (or resumes) the runs cfgs[i] in workdirs[i] in lockstep.

    Returns, per run in order, its last evaluation's metrics (what train_and_evaluate
    returns) or the FloatingPointError that stopped it (a non-finite loss or gradient;
    its workdir holds its last good checkpoint). Any other error stops every run, each
    restorable from its last checkpoint.

    timer(phase) -> a context manager around each phase's work ("build", "rl_steps",
    "eval", "io"), for benchmarks (experiments.bench.bench_tables); work inside it is finished
    (on the host) when it exits.
    """
    _check(cfgs, workdirs)
    timer = timer or (lambda phase: contextlib.nullcontext())
    comps: list[Components] = []
    try:
        states, positions = [], []
        for cfg, workdir in zip(cfgs, workdirs, strict=True):
            with timer("build"):
                c, state = build_components(cfg, workdir, log)
                comps.append(c)
                state, position, _ = loop.resume(c, state)
                jax.block_until_ready(state)
            states.append(state)
            positions.append(position)
        results: list = [None] * len(comps)
        starts = [int(s.step) for s in states]
        for start in sorted(set(starts)):
            group = [i for i, s in enumerate(starts) if s == start]
            if start >= comps[group[0]].cfg.steps:  # finished already: its last evaluation
                for i in group:
                    results[i] = loop.evals_of(comps[i].metrics.records[-1])
                continue
            mine: list = [None] * len(group)
            _run_group(
                [comps[i] for i in group],
                [states[i] for i in group],
                [positions[i] for i in group],
                start,
                mine,
                log,
                progress,
                timer,
            )
            for i, r in zip(group, mine, strict=True):
                results[i] = r
    finally:
        with timer("io"):
            for c in comps:
                c.close()
    with timer("io"):
        for c in comps:
            evaluation.plot(c.metrics.records, c.workdir, title=c.cfg.name)
    return results
