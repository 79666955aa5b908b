"""The host loop: sample on device -> detokenize -> verify -> advantages -> update -> log.

`train_and_evaluate(cfg, workdir)` is the whole run (experiments.train is its CLI). It
resumes from the newest complete checkpoint in workdir; the sampling key of step t is
fold_in(base key, t) and the data position is checkpointed, so a resumed run repeats
exactly what an uninterrupted one does. The pieces come from kjax.rl.components.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import evaluation
from kjax import progress as progress_lib
from kjax.data import loader
from kjax.models import lora
from kjax.rewards.verdict import Verdicts
from kjax.rl import multihost
from kjax.rl import task as task_lib
from kjax.rl.components import Components, build_components
from kjax.rl.config import EvalSplit, RewardSource, TrainConfig
from kjax.rl.rows import (
    eval_metrics,
    evals_of,
    postfix,
    pseudo_label_stats,
    step_row,
    token_stats,
)
from kjax.rl.start_evals import StartEvals
from kjax.rl.train_step import RLBatch, TrainState

__all__ = [
    "Batches",
    "Components",
    "Prepared",
    "Rollout",
    "build_components",
    "eval_key",
    "eval_metrics",
    "eval_problems",
    "evaluate",
    "evals_of",
    "fill_batch",
    "finite_or_raise",
    "lagged_step",
    "postfix",
    "prepare",
    "pseudo_label_stats",
    "resume",
    "rl_step",
    "rollout",
    "step_row",
    "train_and_evaluate",
    "verify",
]

_EVAL_STREAM = 2**31 - 1  # fold_in constant of the evaluation key (fixed across evals)
_ANCHOR_STREAM = 2**31 - 2  # fold_in constant of the reference anchors' key (bon_anchor)
_MAX_REFILLS = 4  # dynamic sampling draws at most this many prompt batches per step


class Rollout(NamedTuple):
    """N verified samples of each of B prompts, as host arrays (each copied once).

    prompts, prompt_mask: [B,S]; tokens, mask: [B,N,T]; sampler_logprobs: [B,N,T] device
    array (copied only for training); verdicts: [B,N]; seconds: (sampling incl.
    transfer, detokenizing + verifying).
    """

    prompts: np.ndarray
    prompt_mask: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    sampler_logprobs: jax.Array
    verdicts: Verdicts
    seconds: tuple[float, float]


class Batches:
    """Training prompts in a fixed order; `position` (checkpointed) is where the next starts."""

    def __init__(self, source, batch_size: int, seed: int, start: loader.Position):
        self.position = start
        self._it = loader.batches(
            source, loader.LoaderConfig(batch_size, seed=seed), start=start, num_epochs=None
        )

    def __next__(self) -> list[dict]:
        self.position, examples = next(self._it)
        return examples


class _Sampling(NamedTuple):
    """A dispatched sampler call (device arrays in flight) and what finishing it needs."""

    examples: Sequence[dict]
    prompts: np.ndarray
    prompt_mask: np.ndarray
    out: object  # kjax.sampling.Rollouts of device arrays
    start: float
    anchor: _Sampling | None = None  # bon_anchor=REFERENCE: the reference's anchor samples


def dispatch_rollout(
    c: Components, params, examples: Sequence[dict], key, n: int, temperature: float
) -> _Sampling:
    """Starts sampling n per prompt on the sampler's devices; returns without waiting.
    params: the sampler's own (c.to_sampler's output)."""
    t0 = time.perf_counter()
    prompts, pmask = task_lib.prompt_batch(c.task, examples)
    sh = c.sample_sharding
    out = c.sampler(
        params,
        multihost.put(prompts, sh),
        multihost.put(pmask, sh),
        key,
        jnp.float32(temperature),
        n=n,
    )
    return _Sampling(examples, prompts, pmask, out, t0)


def dispatch_samples(
    c: Components, params, examples: Sequence[dict], key, n: int, temperature: float
) -> _Sampling:
    """dispatch_rollout of a training step; under objective.bon_anchor=REFERENCE also the
    objective.bon_anchor_samples anchor samples of the same prompts from the fixed
    reference (c.anchor_params), on device, dispatched right after (key folded apart)."""
    s = dispatch_rollout(c, params, examples, key, n, temperature)
    if c.anchor_params is None:
        return s
    m = c.cfg.objective.bon_anchor_samples
    key = jax.random.fold_in(key, _ANCHOR_STREAM)
    return s._replace(anchor=dispatch_rollout(c, c.anchor_params, examples, key, m, temperature))


def finish_rollout(c: Components, s: _Sampling) -> Rollout:
    """Waits for a dispatched sampling, copies it to the host and verifies it."""
    tokens, mask = evaluation.to_host(s.out.tokens), evaluation.to_host(s.out.mask)
    t1 = time.perf_counter()
    verdicts = verify(c, s.examples, tokens, mask)
    seconds = (t1 - s.start, time.perf_counter() - t1)
    return Rollout(s.prompts, s.prompt_mask, tokens, mask, s.out.logprobs, verdicts, seconds)


def rollout(
    c: Components, params, examples: Sequence[dict], key, n: int, temperature: float
) -> Rollout:
    """Samples n per prompt on device and verifies on the host (each host its own rows).
    params: on the training mesh (copied to the sampling group when there is one)."""
    return finish_rollout(
        c, dispatch_rollout(c, c.to_sampler(params), examples, key, n, temperature)
    )


def verify(c: Components, examples: Sequence[dict], tokens: np.ndarray, mask: np.ndarray):
    """Verdicts of completions tokens, mask [B,N,T] (host arrays) of `examples`: each host
    verifies its own rows and the rows are shared, so every host holds all B."""
    sh = c.batch_sharding
    rows = multihost.local_rows(sh, len(examples))
    local = c.task.verify(
        task_lib.decode(c.task, tokens[rows], mask[rows]), [examples[i] for i in rows], c.pool
    )
    shared = (local.scores, local.answer_ids, local.target)
    # counts (the verifier's tallies, e.g. code runs by outcome) are this host's rows only.
    return Verdicts(*multihost.share_rows(shared, rows, len(examples), sh), local.counts)


def evaluate(c: Components, params, start_evals: StartEvals | None = None) -> dict[str, float]:
    """Held-out metrics {"eval/pass@k", "eval/max@k", "eval/maj@k", ...} at eval.n_eval,
    on the split eval.split names (the test problems, or the validation ones for tuning),
    and "eval/objective": the value of the objective the run trains for at its final k
    (objective_value), when eval.n_eval samples can serve it. start_evals (the step-0
    evaluation only): verdicts another run drew from the same parameters and settings are
    read back instead of drawn again (kjax.rl.start_evals)."""
    e = c.cfg.eval

    def draw() -> Verdicts:
        return rollout(c, params, eval_problems(c), eval_key(c), e.n_eval, e.temperature).verdicts

    verdicts = draw() if start_evals is None else start_evals.verdicts(c.cfg, params, draw)
    return eval_metrics(c.cfg, verdicts)


def eval_key(c: Components) -> jax.Array:
    """The evaluation's sampling key (the same at every evaluation of a run)."""
    return jax.random.fold_in(c.base_key, _EVAL_STREAM)


def eval_problems(c: Components) -> Sequence[dict]:
    """The held-out problems eval.split names."""
    return c.task.validation if c.cfg.eval.split is EvalSplit.VALIDATION else c.task.test


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


class Prepared(NamedTuple):
    """The rollouts of RL step `step`, verified, with advantages, ready for its update.

    batch: RLBatch's fields as host arrays (B = batch_prompts rows); kept: informative
    groups; sample_batches: prompt batches drawn (refills included); timing: seconds of
    sample / verify / advantages; tallies: the verifier's counts; votes: pseudo-label
    stats of each drawn batch (label-free rewards).
    """

    step: int
    batch: dict
    kept: int
    sample_batches: int
    timing: dict
    tallies: dict
    votes: list


def begin_prepare(c: Components, params, batches: Batches, step: int) -> tuple[int, _Sampling]:
    """Dispatches the first sampling of step `step`'s rollouts from `params` (the
    sampler's copy); finish with end_prepare. Draws the step's first prompt batch."""
    key = jax.random.fold_in(jax.random.fold_in(c.base_key, step), 0)
    cfg = c.cfg
    return step, dispatch_samples(c, params, next(batches), key, cfg.samples, cfg.temperature)


def end_prepare(c: Components, params, batches: Batches, begun) -> Prepared:
    """Finishes begin_prepare's sampling: verifies, computes the advantages with step's k,
    and refills under dynamic sampling (drawing from `params` again) until the batch holds
    batch_prompts informative groups or _MAX_REFILLS prompt batches were drawn."""
    cfg, (step, sampling) = c.cfg, begun
    k = cfg.k_at(step)
    key = jax.random.fold_in(c.base_key, step)
    timing = {"sample": 0.0, "verify": 0.0, "advantages": 0.0}
    tallies: dict[str, int] = {}  # the verifier's counts over this step's rollouts
    votes: list[dict] = []  # label-free rewards: how good each rollout batch's labels were
    candidates = []
    for attempt in range(_MAX_REFILLS):
        if attempt:
            sampling = dispatch_samples(
                c,
                params,
                next(batches),
                jax.random.fold_in(key, attempt),
                cfg.samples,
                cfg.temperature,
            )
        ro = finish_rollout(c, sampling)
        anchor = None if sampling.anchor is None else finish_rollout(c, sampling.anchor)
        t = time.perf_counter()
        v = ro.verdicts
        adv = np.asarray(
            c.advantages(
                cfg.objective,
                k,
                jnp.asarray(v.scores),
                jnp.asarray(v.answer_ids),
                jnp.asarray(v.target),
                None if anchor is None else jnp.asarray(anchor.verdicts.scores),
            )
        )
        for r in (ro,) if anchor is None else (ro, anchor):
            timing["sample"] += r.seconds[0]
            timing["verify"] += r.seconds[1]
        timing["advantages"] += time.perf_counter() - t
        for name, count in v.counts.items():
            tallies[name] = tallies.get(name, 0) + int(count)
        if cfg.objective.reward is RewardSource.MAJORITY_VOTE:
            votes.append(pseudo_label_stats(cfg, v))
        candidates.append(
            dict(
                prompts=ro.prompts,
                prompt_mask=ro.prompt_mask,
                tokens=ro.tokens,
                mask=ro.mask,
                sampler_logprobs=evaluation.to_host(ro.sampler_logprobs),
                scores=v.scores,
                advantages=adv,
            )
        )
        batch, kept = fill_batch(candidates, cfg.batch_prompts, cfg.dynamic_sampling)
        if kept >= cfg.batch_prompts:
            break
    return Prepared(step, batch, kept, len(candidates), timing, tallies, votes)


def prepare(c: Components, params, batches: Batches, step: int) -> Prepared:
    """Step `step`'s rollouts from params (on the training mesh), ready for its update."""
    own = c.to_sampler(params)
    return end_prepare(c, own, batches, begin_prepare(c, own, batches, step))


def dispatch_update(c: Components, state: TrainState, p: Prepared):
    """Starts the jitted update of state with prepared rollouts; returns (new state,
    metrics as device arrays, the dispatch time). Donates state."""
    batch = RLBatch(**{n: multihost.put(a, c.batch_sharding) for n, a in p.batch.items()})
    t = time.perf_counter()
    new_state, metrics = c.step_fn(state, batch, c.ref_params, np.int32(c.cfg.k_at(p.step)))
    return new_state, metrics, t


def finish_update(c: Components, p: Prepared, metrics, t_update: float, t0: float) -> dict:
    """Waits for an update's metrics; the step's JSON-able row."""
    metrics = {n: float(x) for n, x in jax.device_get(metrics).items()}
    timing = {**p.timing, "update": time.perf_counter() - t_update}
    timing["step"] = time.perf_counter() - t0
    row = step_row(c.cfg, p.step, metrics, p.kept, p.sample_batches, timing, p.tallies, p.votes)
    return {**row, **token_stats(p.batch["mask"], timing["step"])}


def rl_step(c: Components, state: TrainState, batches: Batches) -> tuple[TrainState, dict]:
    """One synchronous RL step from state.step: rollouts (refilled under dynamic
    sampling), advantages, the jitted update. Returns (new state, JSON-able metrics row)."""
    t0 = time.perf_counter()
    p = prepare(c, state.params, batches, int(state.step))
    state, metrics, t = dispatch_update(c, state, p)
    return state, finish_update(c, p, metrics, t, t0)


def lagged_step(
    c: Components, state: TrainState, batches: Batches, pending: collections.deque
) -> tuple[TrainState, dict]:
    """One RL step at rl.policy_lag = d: updates with the oldest pending rollouts (drawn
    d steps ago) and samples step t + d's from the current parameters. With a sampling
    group (mesh.sampler_devices) the sampling is dispatched first and runs while the update
    does; on one group the sampler runs first and its verification (host) overlaps the
    update. The results are the same either way. `pending` holds
    the rollouts of steps t .. t + d - 1 on entry and t + 1 .. t + d on return."""
    cfg, t = c.cfg, int(state.step)
    t0 = time.perf_counter()
    ahead = t + cfg.rl.policy_lag
    begun = None
    if ahead < cfg.steps:
        own = c.to_sampler(state.params)
        begun = own, begin_prepare(c, own, batches, ahead)
        if not c.overlaps:
            # One group: the update donates state.params, which this sampling reads, so the
            # sampler finishes first; its verification still overlaps the update (below),
            # except under dynamic sampling, whose refills sample from these params again.
            jax.block_until_ready(begun[1][1].out)
            if cfg.dynamic_sampling:
                pending.append(end_prepare(c, own, batches, begun[1]))
                begun = None
    p = pending.popleft()
    if p.step != t:
        raise RuntimeError(f"pending rollouts are for step {p.step}, not {t}")  # a kjax bug
    state, metrics, t_update = dispatch_update(c, state, p)
    spans = {}
    if begun is not None and not c.overlaps:  # verifies while the update runs
        pending.append(end_prepare(c, begun[0], batches, begun[1]))
    elif begun is not None:  # overlapped: when each group's program was in flight
        ready = {}
        waiter = threading.Thread(
            target=lambda: ready.setdefault("update", (jax.block_until_ready(metrics),
                                                       time.perf_counter())[1])
        )  # fmt: skip
        waiter.start()
        pending.append(end_prepare(c, begun[0], batches, begun[1]))
        sample_ready = time.perf_counter()
        waiter.join()
        spans = {
            "sample_dispatched": begun[1][1].start - t0,
            "sample_ready": sample_ready - t0,
            "update_dispatched": t_update - t0,
            "update_ready": ready["update"] - t0,
        }
        spans["overlap"] = max(
            0.0,
            min(spans["sample_ready"], spans["update_ready"])
            - max(spans["sample_dispatched"], spans["update_dispatched"]),
        )
    row = finish_update(c, p, metrics, t_update, t0)
    row.update({f"time/{n}": v for n, v in spans.items()})
    return state, row


def finite_or_raise(c: Components, row: dict) -> None:
    """Raises FloatingPointError (naming the last good checkpoint) when the step's loss or
    gradient was not finite; the run stops without saving that step."""
    if not row["finite"]:
        c.checkpointer.wait()
        raise FloatingPointError(
            f"loss or gradient is not finite at RL step {row['step'] - 1} (loss={row['loss']}, "
            f"grad_norm={row['grad_norm']}); stopped without saving. The last good "
            f"checkpoint is step {c.checkpointer.latest_step()} in {c.checkpointer.directory}."
        )


def resume(
    c: Components, state: TrainState
) -> tuple[TrainState, loader.Position, collections.deque]:
    """The newest checkpoint's state, data position and pending rollouts (rl.policy_lag >
    0: those drawn ahead for the next steps), else the initial ones. metrics.jsonl keeps
    the rows up to the checkpoint's step and drops the rest, which are about to be redone;
    with no checkpoint that is every row (a run killed before its first save had already
    written its step-0 evaluation, and a restart writes it again)."""
    if c.checkpointer.latest_step() is None:
        c.metrics.resume(-1)  # no row is kept, step 0's included
        return state, loader.Position(), collections.deque()
    initial, state = state, _on_disk(c, state)
    if c.cfg.rl.policy_lag:
        infos = c.checkpointer.meta()["pending"]
        like = {"train": state, "pending": [_pending_like(c, i) for i in infos]}
        tree, meta = c.checkpointer.restore(like)
        state = tree["train"]
        pending = collections.deque(
            _unpack_pending(i, a) for i, a in zip(infos, tree["pending"], strict=True)
        )
        _check_extension(c, int(state.step), len(pending))
    else:
        (state, meta), pending = c.checkpointer.restore(state), collections.deque()
    state = _from_disk(c, state, meta, initial)
    c.metrics.resume(int(state.step))
    c.log(f"resumed from step {int(state.step)} in {c.workdir}")
    return state, loader.Position(**meta["position"]), pending


def _check_extension(c: Components, step: int, pending: int) -> None:
    """Refuses to extend a lagged run past the steps it was drawing rollouts for.

    A run of S steps at lag d draws no rollouts for steps S .. S + d - 1, and a run of more
    steps would have drawn them from the parameters of steps S - d .. S - 1, which are not
    kept: an extended run could not be the run that had the higher step count from the
    start, so it is refused rather than silently made different (a synchronous run
    extends exactly)."""
    lag, steps = c.cfg.rl.policy_lag, c.cfg.steps
    if pending >= min(lag, steps - step):
        return
    drawn = step + pending

    def span(a: int, b: int) -> str:
        return f"step {a}" if a == b else f"steps {a} to {b}"

    raise ValueError(
        f"workdir {c.workdir} holds a lagged run (rl.policy_lag={lag}) checkpointed at step "
        f"{step} with rollouts drawn up to step {drawn}, and steps={steps} asks for more: "
        f"the rollouts of {span(drawn, min(step + lag, steps) - 1)} would have come from the "
        f"parameters of {span(drawn - lag, min(step, steps - lag) - 1)}, which the run did "
        "not keep, so the extended run could not equal one trained for "
        f"{steps} steps from the start. Train {steps} steps in a new --workdir, or set "
        f"steps back to {drawn} (experiment.json too)."
    )


def _on_disk(c: Components, state: TrainState) -> TrainState:
    """What a checkpoint holds of state: under LoRA the adapters only (the frozen base is
    rebuilt from the run's config, and checked against c.base_id on resume)."""
    if c.base_id is None:
        return state
    return state._replace(params=lora.split(state.params)[0])


def _from_disk(c: Components, restored: TrainState, meta: dict, initial: TrainState):
    """The full state of a restored checkpoint: its adapters on this run's frozen base,
    refused when that base is not the one the adapters were trained on."""
    if c.base_id is None:
        return restored
    saved = meta.get("lora_base")
    frozen = lora.split(initial.params)[1]
    if not lora.same_base(saved, frozen, c.base_id):
        raise ValueError(
            f"{c.checkpointer.directory} holds LoRA adapters trained on the base model with "
            f"fingerprint {saved}, but this run's base (config.model, after its SFT warm "
            f"start) has fingerprint {c.base_id}: the model file or warm start changed. "
            "Restore the original base, or train in a new --workdir."
        )
    return restored._replace(params=lora.join(restored.params, frozen))


def _pending_like(c: Components, info: dict) -> dict:
    replicated = NamedSharding(c.mesh, P())
    return {
        n: jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=replicated)
        for n, (shape, dtype) in info["arrays"].items()
    }


def _unpack_pending(info: dict, arrays: dict) -> Prepared:
    batch = {n: evaluation.to_host(arrays[n]) for n in info["arrays"]}
    return Prepared(
        info["step"], batch, info["kept"], info["sample_batches"], info["timing"],
        info["tallies"], info["votes"],
    )  # fmt: skip


def save(c: Components, step: int, state: TrainState, batches: Batches, pending, force: bool):
    """Checkpoints state after `step` RL steps with the data position and, under
    rl.policy_lag, the pending rollouts (whose prompts the position has passed)."""
    meta = {"position": dataclasses.asdict(batches.position)}
    if c.base_id is not None:
        meta["lora_base"] = c.base_id
    state = _on_disk(c, state)
    if not c.cfg.rl.policy_lag:
        c.checkpointer.save(step, state, meta, force=force)
        return
    if not c.checkpointer.due(step, force=force):
        return
    replicated = NamedSharding(c.mesh, P())
    meta["pending"] = [
        {
            "step": p.step,
            "kept": p.kept,
            "sample_batches": p.sample_batches,
            "timing": p.timing,
            "tallies": p.tallies,
            "votes": p.votes,
            "arrays": {n: [list(a.shape), str(a.dtype)] for n, a in p.batch.items()},
        }
        for p in pending
    ]
    arrays = [{n: jax.device_put(a, replicated) for n, a in p.batch.items()} for p in pending]
    c.checkpointer.save(step, {"train": state, "pending": arrays}, meta, force=force)


def train_and_evaluate(
    cfg: TrainConfig,
    workdir,
    *,
    log=print,
    progress: bool = True,
    start_evals: StartEvals | None = None,
) -> dict:
    """Runs (or resumes) the experiment in workdir; returns the last evaluation's metrics.
    start_evals: where runs share their step-0 evaluation (kjax.rl.start_evals; None: each
    run draws its own)."""
    c, state = build_components(cfg, workdir, log)
    cfg = c.cfg
    bar = None
    try:
        state, position, pending = resume(c, state)
        start = int(state.step)
        batches = Batches(c.task.train, cfg.batch_prompts, cfg.seed, position)
        last_eval = {}
        if start == 0:
            last_eval = evaluate(c, state.params, start_evals)
            c.metrics.write({"step": 0, **last_eval})
        lag = cfg.rl.policy_lag
        if lag and start == 0:  # the first lag steps' rollouts come from the initial params
            for ahead in range(min(lag, cfg.steps)):
                pending.append(prepare(c, state.params, batches, ahead))
        show = progress and multihost.is_leader()
        bar = progress_lib.progress(cfg.steps, start, cfg.name, enabled=show)
        for step in range(start, cfg.steps):
            if lag:
                state, row = lagged_step(c, state, batches, pending)
            else:
                state, row = rl_step(c, state, batches)
            finite_or_raise(c, row)
            if (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps:
                last_eval = evaluate(c, state.params)
                row.update(last_eval)
            c.metrics.write(row)
            bar.update(1)
            bar.set_postfix(**postfix(row, last_eval, cfg.eval.n_eval))
            save(c, step + 1, state, batches, pending, force=step + 1 == cfg.steps)
        c.checkpointer.wait()
    finally:
        if bar is not None:
            bar.close()
        c.close()
    records = c.metrics.records
    if multihost.is_leader():
        evaluation.plot(records, c.workdir, title=cfg.name)
    return last_eval or evals_of(records[-1])
