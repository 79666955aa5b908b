"""sft.seed: one warm start shared by every run seed, or (None) one per run seed."""

import dataclasses

import jax
import numpy as np

from kjax.rl import loop
from kjax.rl.components import warm_start_cached
from kjax.rl.config import SFTConfig, StepConfig
from tests.rl.tiny_run import TINY


def _config(tmp_path, seed: int, sft_seed, steps: int = 4):
    sft = SFTConfig(steps=steps, batch_size=8, seed=sft_seed, cache_dir=str(tmp_path / "sft"))
    return dataclasses.replace(TINY, seed=seed, sft=sft, rl=StepConfig())  # B=8 on 8 devices


def _warm_params(tmp_path, name: str, seed: int, sft_seed):
    cfg = _config(tmp_path, seed, sft_seed)
    c, state = loop.build_components(cfg, tmp_path / name, log=lambda *a, **k: None)
    c.checkpointer.close()
    return [np.asarray(x) for x in jax.tree.leaves(state.params)], c.base_key


def test_a_fixed_sft_seed_shares_one_warm_start_across_run_seeds(tmp_path):
    # Run seed 1 finds run seed 0's warm start in the shared cache (the identity matches)
    # and starts from the same parameters; with sft.seed=None both the init and the
    # cache identity would follow the run seed.
    assert not warm_start_cached(_config(tmp_path, 0, 7))
    a, key_a = _warm_params(tmp_path, "run0", seed=0, sft_seed=7)
    # What the tables' warm_start checks before building a run only to find it cached:
    # this config's warm start, not another SFT's or another seed's.
    assert warm_start_cached(_config(tmp_path, 1, 7))
    assert not warm_start_cached(_config(tmp_path, 0, 7, steps=5))
    assert not warm_start_cached(_config(tmp_path, 0, 8))
    b, key_b = _warm_params(tmp_path, "run1", seed=1, sft_seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # ... while the RL seed still differs (sampling, data order).
    assert not np.array_equal(jax.random.key_data(key_a), jax.random.key_data(key_b))
