"""kjax.scale.calibration: MaxText's FLOP count against its own published figures, and the
pre-training step compiled for v6e:2x2 on a tiny model (the projection's arithmetic)."""

import pytest

from experiments.plan_scale import KNOWN_MODELS
from kjax import scale
from kjax.models.config import LlamaConfig
from kjax.scale import calibration


def test_maxtext_flop_count_reproduces_its_published_mfu():
    """MaxText's 45.46% MFU at 7,207 tokens/s/chip on v6e (918 TFLOP/s) means 5.79e10
    FLOPs per token: 6 x (6.98e9 layer matmul params + 4096 x 128256 head) plus 12 x 8192
    x 32 heads x 128 x 32 layers of attention, not halved for the causal mask."""
    c = LlamaConfig.from_hf(KNOWN_MODELS["llama-3.1-8b"])
    per_token = calibration.maxtext_flops_per_token(c, 8192)
    assert per_token == 6 * (6_979_321_856 + 4096 * 128256) + 12 * 8192 * 32 * 128 * 32
    m = calibration.MAXTEXT_LLAMA31_8B_V6E
    assert m.tokens_per_s_per_chip * per_token / 918e12 == pytest.approx(m.mfu, rel=1e-3)


@pytest.mark.skipif(scale.libtpu_missing() is not None, reason="no libtpu")
def test_tiny_pretraining_step_projects_tokens_per_chip_from_its_time():
    from tests.test_scale import CONFIG

    measured = calibration.Measured(1000.0, 0.5, seq=64, per_device_batch=2, source="test")
    r = calibration.calibrate(CONFIG, "v6e:2x2", measured=measured)
    assert r.chips == 4 and r.mesh == (1, 4, 1)
    # Full remat: at least the model's forward + backward (the MaxText count without
    # its attention term, which counts keys the causal mask drops) per token per chip.
    dense = 6 * (scale.matmul_params(CONFIG) + CONFIG.hidden_size * CONFIG.vocab_size)
    assert r.step.flops >= dense * 2 * 64
    assert r.step.ici and set(r.step.ici) == {"fsdp"}
    t = max(r.step.compute_seconds(r.chip), r.step.hbm_seconds(r.chip), r.step.ici_seconds(r.chip))
    assert r.tokens_per_s_per_chip() == pytest.approx(2 * 64 / t)
    assert r.ratio() == pytest.approx(r.tokens_per_s_per_chip() / 1000.0)
    assert r.mfu(serial=True) < r.mfu()


def test_pretraining_loss_through_splash_equals_the_jnp_reference():
    """The calibration's kernel path (splash in Pallas interpret mode on CPU, the chunked
    head) against the jnp forward's [B,S,V] cross-entropy: value and gradients."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from kjax.models import llama
    from kjax.models.config import AttentionBackend
    from tests.models.test_attention import CONFIG

    config = dataclasses.replace(CONFIG, num_layers=1)
    params = llama.Llama(config, rngs=nnx.Rngs(params=jax.random.key(4, impl="unsafe_rbg")))
    params = params.params()
    tokens = jax.random.randint(jax.random.key(5), (2, 12), 0, config.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    splash = dataclasses.replace(config, attention=AttentionBackend.SPLASH)

    def value_and_grad(c):
        loss = lambda p: calibration.pretrain_loss(p, tokens, targets, c=c, dtype=jnp.float32,
                                                   remat=True)  # fmt: skip
        return jax.jit(jax.value_and_grad(loss))(params)

    loss_ref, g_ref = value_and_grad(config)
    loss, g = value_and_grad(splash)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize(("S", "N", "T"), [(7, 0, 0), (5, 3, 4), (1, 2, 6)])
def test_attention_density_counts_the_unmasked_entries(S, N, T):
    """The share of the [L, L] scores the shared-prompt mask leaves, against the mask."""
    import numpy as np

    L = S + N * T
    q, k = np.arange(L)[:, None], np.arange(L)[None]
    own = lambda i: (i - S) // max(T, 1)
    prompt = (k < S) & ((q >= S) | (k <= q))
    same = (q >= S) & (k >= S) & (own(q) == own(k)) & (k <= q)
    assert scale.attention_density(S, N, T) == pytest.approx((prompt | same).mean())
