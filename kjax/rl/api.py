"""A small public API for measurements outside the RL loop (experiments, benchmarks).

    with api.open_run(cfg, workdir) as run:        # model, task, mesh, warm-started params
        verdicts = api.sample_verdicts(run, run.params, run.task.test, key, n=16)
        state, sft_step = api.sft_trainer(run, cfg.sft, optimizer, seed=0)
        state, metrics = sft_step(state, examples)  # one SFT update on a list of examples
        state, rows = api.rl_steps(run, run.state, steps=3)  # the loop's own RL steps

A `Run` is what kjax.rl.components.build_components builds (the same validation, workdir,
SFT warm start and jitted step), behind a handful of properties: the model's config, the
task (its tokenizer, splits and prompt width), the mesh and the initial TrainState. Code
that needs more of the loop's pieces can still read `run.components`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kjax.data.loader import Position
from kjax.models import LlamaConfig
from kjax.rewards.verdict import Verdicts
from kjax.rl import loop, sft
from kjax.rl.components import Components, build_components, step_and_sampler
from kjax.rl.config import SFTConfig, TrainConfig
from kjax.rl.task import Task
from kjax.rl.train_step import (
    RLBatch,
    TrainState,
    init_train_state,
    shardings_of,
)

__all__ = [
    "Run",
    "evaluate",
    "lower_update",
    "open_run",
    "rl_steps",
    "sample_verdicts",
    "sft_trainer",
    "with_model",
]


def _quiet(*args, **kwargs) -> None:
    del args, kwargs


@dataclasses.dataclass(frozen=True)
class Run:
    """A built run: its components and its initial TrainState (after the SFT warm start).

    Close it when done (`run.close()`, or use it as a context manager): it holds the run's
    checkpointer, metrics writer and verifier pool.
    """

    components: Components
    state: TrainState

    @property
    def cfg(self) -> TrainConfig:
        """The validated TrainConfig."""
        return self.components.cfg

    @property
    def model_config(self) -> LlamaConfig:
        return self.components.model_config

    @property
    def task(self) -> Task:
        """Problems (train / validation / test), prompt width S, stop ids and verifier."""
        return self.components.task

    @property
    def tokenizer(self):
        return self.components.tokenizer

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.components.mesh

    @property
    def params(self):
        """The initial params (after the SFT warm start, if the config has one)."""
        return self.state.params

    def close(self) -> None:
        self.components.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_run(cfg: TrainConfig, workdir, *, log: Callable = _quiet) -> Run:
    """Validates cfg, claims workdir and builds the run: model, tokenizer, task (data
    prepared under workdir/data), mesh, SFT warm start (cached in cfg.sft.cache_dir or
    workdir/sft), optimizer and the jitted RL step. Quiet unless `log` is given."""
    components, state = build_components(cfg, workdir, log=log)
    return Run(components, state)


def sample_verdicts(
    run: Run, params, problems: Sequence[dict], key: jax.Array, n: int, temperature: float = 1.0
) -> Verdicts:
    """Samples n completions of each problem with `params` (any params pytree of the run's
    model) and verifies them: Verdicts with scores / answer_ids [len(problems), n] and
    target [len(problems)]. len(problems) must divide over the mesh's batch devices."""
    return loop.rollout(run.components, params, problems, key, n, temperature).verdicts


def evaluate(run: Run, params) -> dict[str, float]:
    """The run's held-out evaluation of `params` (cfg.eval: split, n_eval, temperature):
    {"eval/pass@k", "eval/max@k", "eval/maj@k", ..., "eval/objective"}, as the loop logs."""
    return loop.evaluate(run.components, params)


def sft_trainer(
    run: Run,
    cfg: SFTConfig,
    optimizer: optax.GradientTransformation,
    seed: int,
    params=None,
) -> tuple[TrainState, Callable[[TrainState, Sequence[dict]], tuple[TrainState, dict]]]:
    """(initial state, step) for supervised fine-tuning of the run's model.

    The state holds `params` (default: the run's) and optimizer.init of them; its key is
    jax.random.key(seed). step(state, examples) -> (state, metrics) makes one update on
    the cfg.loss (cross-entropy or DCO) of each example's prompt + reference answer, right-
    padded to run.task.prompt_len + run.cfg.max_new_tokens (one shape: never retraces).
    metrics: "loss", "grad_norm" and the loss's own, as arrays. The state is donated, and
    it holds `params` themselves: after the first step they (and, by default, run.params)
    are consumed; pass a copy (jax.tree.map(jnp.copy, run.params)) to keep them.
    """
    params = run.params if params is None else params
    state = init_train_state(params, optimizer, jax.random.key(seed), run.mesh)
    dtype = run.cfg.model.compute_dtype
    update = sft.make_sft_step(
        run.model_config, cfg, optimizer, run.mesh, shardings_of(state), dtype
    )
    length = run.task.prompt_len + run.cfg.max_new_tokens

    def step(state: TrainState, examples: Sequence[dict]) -> tuple[TrainState, dict]:
        return update(state, *sft.sequences(run.task, list(examples), length))

    return state, step


def rl_steps(
    run: Run, state: TrainState, steps: int, start: Position | None = None
) -> tuple[TrainState, list[dict]]:
    """`steps` RL steps of the loop (sample, verify, advantages, update) from `state`, on
    the run's training prompts from `start` (default: the beginning, in the cfg.seed
    order). Returns the final state and each step's metrics row (incl. "time/<stage>").
    Synchronous only: a run with rl.policy_lag > 0 trains through loop.train_and_evaluate,
    which keeps the rollouts drawn ahead."""
    if run.cfg.rl.policy_lag:
        raise ValueError(
            f"rl_steps runs the synchronous loop; this run has rl.policy_lag="
            f"{run.cfg.rl.policy_lag}. Train it with kjax.rl.loop.train_and_evaluate (or "
            "experiments.train), which samples ahead and checkpoints the pending rollouts."
        )
    batches = loop.Batches(run.task.train, run.cfg.batch_prompts, run.cfg.seed, start or Position())
    rows = []
    for _ in range(steps):
        state, row = loop.rl_step(run.components, state, batches)
        rows.append(row)
    return state, rows


def with_model(run: Run, model_config: LlamaConfig, params) -> Run:
    """The run with another model (e.g. a wider vocabulary of the same shape): `params`
    (already on run.mesh) in a fresh TrainState, and the RL step and sampler rebuilt for
    model_config. Everything else (task, optimizer, checkpointer, ...) is shared with
    `run`: close only one of them."""
    c, cfg = run.components, run.cfg
    state = init_train_state(params, c.optimizer, jax.random.key(cfg.seed), run.mesh)
    step_fn, sampler = step_and_sampler(cfg, model_config, run.mesh, state, run.task)
    components = dataclasses.replace(c, model_config=model_config, step_fn=step_fn, sampler=sampler)
    return Run(components, state)


def lower_update(run: Run, state: TrainState | None = None, k: int | None = None):
    """The run's jitted RL update lowered (jax.stages.Lowered) for one batch of the run's
    shape, B = batch_prompts, N = samples, S = prompt_len, T = max_new_tokens, without
    running it (e.g. `.compile().cost_analysis()` for its FLOPs). state: the TrainState
    it is lowered for (default run.state; only shapes, dtypes and shardings are read);
    k: the [] int32 the step receives (default cfg.objective.k)."""
    cfg, c = run.cfg, run.components
    B, N, S, T = cfg.batch_prompts, cfg.samples, run.task.prompt_len, cfg.max_new_tokens

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=c.batch_sharding)

    batch = RLBatch(
        spec((B, S), jnp.int32),
        spec((B, S), bool),
        spec((B, N, T), jnp.int32),
        spec((B, N, T), bool),
        spec((B, N, T), jnp.float32),
        spec((B, N), jnp.float32),
        spec((B, N), jnp.float32),
    )

    def abstract(tree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
        )

    state = abstract(run.state if state is None else state)
    ref_params = None if c.ref_params is None else state.params  # the KL reference's shapes
    k = cfg.objective.k if k is None else k
    return c.step_fn.lower(state, batch, ref_params, np.int32(k))
