"""SFT warm start: the step is the gradient of a hand-written cross-entropy; cached runs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kjax.data import loader
from kjax.models import llama
from kjax.rl import sft
from kjax.rl.config import SFTConfig
from kjax.rl.task import load_task
from kjax.rl.train_step import init_train_state, shardings_of
from tests.rl.rl_helpers import CONFIG, mesh, tiny_params
from tests.rl.tiny_run import TINY


def test_sft_step_is_the_gradient_of_token_mean_cross_entropy():
    rng = np.random.default_rng(0)
    lengths = np.array([5, 7])
    tokens = rng.integers(1, CONFIG.vocab_size, (2, 8)).astype(np.int32)
    attn = np.arange(8)[None] < lengths[:, None]
    loss_mask = attn & (np.arange(8)[None] >= 3)  # the "answer": positions 3 .. length-1

    def reference(params):  # per sequence, unpadded: mean over answer tokens of -log p
        total = 0.0
        for row, n in enumerate(lengths):
            logp = jax.nn.log_softmax(llama.forward(params, CONFIG, tokens[row : row + 1, :n])[0])
            nll = -logp[np.arange(2, n - 1), tokens[row, 3:n]]
            total += jnp.mean(nll)
        return total / 2

    m, opt = mesh(2), optax.sgd(1.0)
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    step = sft.make_sft_step(CONFIG, SFTConfig(), opt, m, shardings_of(state))
    state, metrics = step(state, tokens, attn, loss_mask)
    params = tiny_params()
    # jitted: the per-row reference op by op took ~20 s of the suite's time
    np.testing.assert_allclose(float(metrics["loss"]), float(jax.jit(reference)(params)), rtol=1e-5)
    expected = jax.tree.map(lambda p, g: p - g, params, jax.jit(jax.grad(reference))(params))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def test_warm_start_learns_and_is_cached(tmp_path):
    cfg = dataclasses.replace(TINY, sft=SFTConfig(steps=25, batch_size=16, learning_rate=1e-2))
    task = load_task(cfg, None, tmp_path / "data")
    from kjax.rl.components import build_model

    m = mesh(8)
    model_config, params, _ = build_model(cfg, m)
    examples = [loader.decode(task.train[i]) for i in range(32)]
    seqs = sft.sequences(task, examples, task.prompt_len + 4)
    loss = jax.jit(lambda p: sft.sft_loss(p, model_config, *seqs, cfg.sft, jnp.float32)[0])
    before = float(loss(params))
    logs = []
    kwargs = dict(mesh=m, cache_dir=tmp_path / "sft", identity={"a": 1}, seed=0,
                  completion_len=4, log=logs.append)  # fmt: skip
    trained = sft.warm_start(params, model_config, task, cfg.sft, **kwargs)
    assert float(loss(trained)) < 0.8 * before
    again = sft.warm_start(params, model_config, task, cfg.sft, **kwargs)
    assert "reusing" in logs[-1]
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
