"""completion_logprobs: the shared-prompt, completion-only chunked path against the
repeated-prompt full-logits reference (values, entropies and gradients), the chunked
log-probs against the plain computation, and the sampler's raw-model log-probs."""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kjax import sampling
from kjax.models import Family, Llama, LlamaConfig
from kjax.rl import forward

BASE = LlamaConfig(
    vocab_size=37, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, rope_theta=500.0, rms_norm_eps=1e-5,
)  # fmt: skip


def _params(config, seed):
    """Random params with O(1) logits (the 0.02 init makes every distribution ~uniform)."""
    shapes = jax.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(params=0)).params())
    rng = np.random.default_rng(seed)  # numpy: no initializer compilations

    def draw(path, x):
        if "norm" in jax.tree_util.keystr(path):
            return jnp.asarray(1 + 0.3 * rng.standard_normal(x.shape), jnp.float32)
        return jnp.asarray(0.25 * rng.standard_normal(x.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def _batch(config, B, S, N, T, seed):
    """Left-padded prompts (row 1 has 2 pads, the last row one real token when B > 2)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), bool)
    if B > 1:
        mask[1, :2] = False
    if B > 2:
        mask[-1, : S - 1] = False
    prompts = np.where(mask, rng.integers(0, config.vocab_size, (B, S)), 0).astype(np.int32)
    tokens = rng.integers(0, config.vocab_size, (B, N, T)).astype(np.int32)
    return jnp.asarray(prompts), jnp.asarray(mask), jnp.asarray(tokens)


CASES = [  # (config changes, B, S, N, T)
    (dict(), 3, 7, 3, 5),  # GQA, left padding, one prompt with a single real token
    (dict(num_heads=6, num_kv_heads=1, head_dim=4, tie_embeddings=True), 2, 5, 1, 1),  # MQA,
    # Qwen3's q/k norms and a window of 3 positions on layer 1 (over prompt and completion)
    (dict(family=Family.QWEN3, sliding_window=3, sliding_layers=(False, True)), 3, 7, 2, 5),
]  # tied head, N = 1, T = 1


@pytest.mark.parametrize("case", range(len(CASES)))
def test_shared_prompt_equals_repeated_prompt(case):
    changes, B, S, N, T = CASES[case]
    config = dataclasses.replace(BASE, **changes)
    params = _params(config, seed=case)
    prompts, mask, tokens = _batch(config, B, S, N, T, seed=case)
    weights = jax.random.normal(jax.random.key(7), tokens.shape)

    def objective(params, shared):
        stats = forward.completion_logprobs(params, config, prompts, mask, tokens,
                                            shared_prompt=shared, with_entropy=True,
                                            chunk_rows=4)  # fmt: skip
        return jnp.sum(weights * stats.logprobs) + jnp.sum(stats.entropy**2), stats

    grads = lambda p: [jax.grad(objective, has_aux=True)(p, s) for s in (True, False)]  # noqa: E731
    (g_new, new), (g_ref, ref) = jax.jit(grads)(params)  # one compilation for both paths
    # The test can fail: log-probs are far from uniform and vary per token.
    assert float(jnp.std(ref.logprobs)) > 0.3
    np.testing.assert_allclose(new.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(new.entropy, ref.entropy, atol=1e-5, rtol=0)
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g_new),
                          jax.tree.leaves(g_new), jax.tree.leaves(g_ref), strict=True):  # fmt: skip
        scale = float(jnp.max(jnp.abs(b)))
        assert scale > 0, path[0]
        err = float(jnp.max(jnp.abs(a - b))) / scale
        assert err < 1e-4, (jax.tree_util.keystr(path[0]), err)


@pytest.mark.slow  # the default tier compares against the repeated-prompt path
def test_logprobs_match_the_full_forward_of_each_sequence():
    """Independent of both paths: each completion run alone (its prompt's padding
    dropped) through llama.forward, log_softmax at its positions."""
    config = BASE
    params = _params(config, seed=3)
    prompts, mask, tokens = _batch(config, 3, 6, 2, 4, seed=3)
    stats = forward.completion_logprobs(params, config, prompts, mask, tokens)
    full = jax.jit(forward.llama.forward, static_argnums=1)
    for b in range(3):
        real = np.asarray(prompts[b])[np.asarray(mask[b])]
        seqs = jnp.concatenate([jnp.broadcast_to(real, (2, len(real))), tokens[b]], axis=1)
        logp = jax.nn.log_softmax(full(params, config, seqs), axis=-1)  # [N, L+T, V]
        L = len(real)
        want = jnp.take_along_axis(logp[:, L - 1 : L + 3], tokens[b][..., None], -1)[..., 0]
        np.testing.assert_allclose(stats.logprobs[b], want, atol=1e-5)


@pytest.mark.parametrize(
    "chunk_rows,chunk_vocab,tied",
    [(5, None, True), (64, None, False), (5, 8, False), (64, 37, True), (None, 16, True)],
)
def test_chunked_stats_equal_plain(chunk_rows, chunk_vocab, tied):
    """chunked_token_stats (any row chunk, padded last one; vocabulary chunks that divide
    V=37 or leave a tail) vs plain log_softmax of the full unembedding, values and
    gradients through the hand-written backward."""
    config = dataclasses.replace(BASE, tie_embeddings=tied)
    params = _params(config, seed=5)
    hidden = jax.random.normal(jax.random.key(1), (2, 3, 7, config.hidden_size))
    targets = jax.random.randint(jax.random.key(2), (2, 3, 7), 0, config.vocab_size)

    def chunked(params, hidden):
        s = forward.chunked_token_stats(params, config, hidden, targets, with_entropy=True,
                                        chunk_rows=chunk_rows, chunk_vocab=chunk_vocab)  # fmt: skip
        return jnp.sum(s.logprobs * jnp.cos(s.entropy)), s

    def plain(params, hidden):
        s = forward.stats_of_logits(forward.llama.unembed(params, config, hidden.reshape(
            6, 7, -1)).reshape(2, 3, 7, -1), targets, with_entropy=True)  # fmt: skip
        return jnp.sum(s.logprobs * jnp.cos(s.entropy)), s

    both = lambda p, h: [jax.grad(f, argnums=(0, 1), has_aux=True)(p, h)  # noqa: E731
                         for f in (chunked, plain)]  # fmt: skip
    (ga, a), (gb, b) = jax.jit(both)(params, hidden)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    np.testing.assert_allclose(a.entropy, b.entropy, atol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5 * float(jnp.max(jnp.abs(y))) + 1e-7)


def test_chunked_stats_never_hold_all_logits():
    """Compiled peak memory of the gradient grows with the chunk, not with rows x V."""
    config = dataclasses.replace(BASE, vocab_size=4096)
    params = _params(config, seed=0)
    targets = jnp.zeros((1024,), jnp.int32)
    hidden = jax.ShapeDtypeStruct((1024, config.hidden_size), jnp.float32)

    def temp_bytes(chunk_rows, chunk_vocab):
        f = lambda p, h: jnp.sum(  # noqa: E731
            forward.chunked_token_stats(
                p, config, h, targets, chunk_rows=chunk_rows, chunk_vocab=chunk_vocab
            ).logprobs
        )
        compiled = jax.jit(jax.grad(f, argnums=1)).lower(params, hidden).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    full = 1024 * 4096 * 4
    assert temp_bytes(1024, 4096) >= full  # the unchunked computation holds all logits
    assert temp_bytes(32, 4096) < full / 4  # chunks of rows
    assert temp_bytes(1024, 256) < full / 4  # chunks of vocabulary columns


def test_sampler_model_logprobs_agree():
    """The sampler's returned raw-model log-probs vs completion_logprobs on its tokens."""
    config = BASE
    params = _params(config, seed=11)
    prompts, mask, _ = _batch(config, 3, 6, 1, 1, seed=11)
    out = sampling.sample_params(params, prompts, mask, jax.random.key(0), jnp.float32(1.0),
                                 config=config, n=4, max_new_tokens=9, stop_ids=(3,))  # fmt: skip
    stats = forward.completion_logprobs(params, config, prompts, mask, out.tokens)
    diff = np.abs(np.asarray(stats.logprobs - out.model_logprobs))[np.asarray(out.mask)]
    print(f"max |sampler model_logprobs - completion_logprobs| = {diff.max():.2e}")
    assert diff.max() < 2e-5
    assert float(np.std(np.asarray(out.model_logprobs)[np.asarray(out.mask)])) > 0.1


def test_bad_shapes_name_the_inputs():
    prompts, mask, tokens = _batch(BASE, 2, 4, 2, 3, seed=0)
    with pytest.raises(ValueError, match="tokens"):
        forward.completion_logprobs({}, BASE, prompts, mask, tokens[0])
    with pytest.raises(ValueError, match="disagree on B"):
        forward.completion_logprobs({}, BASE, prompts, mask, tokens[:1])


def _tempered_rollout(temperature: float):
    config = BASE
    params = _params(config, seed=12)
    prompts, mask, _ = _batch(config, 2, 6, 1, 1, seed=12)
    out = sampling.sample_params(params, prompts, mask, jax.random.key(1),
                                 jnp.float32(temperature), config=config, n=4,
                                 max_new_tokens=7, stop_ids=(3,))  # fmt: skip
    return config, params, prompts, mask, out


@pytest.mark.parametrize("shared_prompt", [True, False])
def test_trainer_logprobs_are_the_samplers_at_temperature(shared_prompt):
    """At T = 0.7 the trainer's log-probs are those of the distribution the sampler drew
    from (softmax(logits / 0.7)), on both forward paths; at T = 1 they are not."""
    config, params, prompts, mask, out = _tempered_rollout(0.7)
    valid = np.asarray(out.mask)

    def gap(temperature):
        stats = forward.completion_logprobs(params, config, prompts, mask, out.tokens,
                                            shared_prompt=shared_prompt,
                                            temperature=temperature)  # fmt: skip
        return np.abs(np.asarray(stats.logprobs - out.logprobs))[valid].max()

    print(f"max |trainer - sampler| log-prob at T=0.7: {gap(0.7):.2e} (T=1: {gap(1.0):.2e})")
    assert gap(0.7) < 2e-5
    assert gap(1.0) > 0.05  # the untempered model is a different policy


def test_train_step_differentiates_the_sampling_policy():
    """The update's old log-probs are the sampler's at its temperature: with truncated IS
    weights on, the trainer/sampler mismatch it measures is ~0 (it is not when the step
    is built for T = 1 while the rollouts came from T = 0.7)."""
    import optax

    from kjax import sharding
    from kjax.rl.step_config import PolicyLoss, StepConfig
    from kjax.rl.train_step import RLBatch, init_train_state, make_train_step, shardings_of

    config, params, prompts, mask, out = _tempered_rollout(0.7)
    B, N, _ = out.tokens.shape
    batch = RLBatch(prompts, mask, out.tokens, out.mask, out.logprobs,
                    jnp.zeros((B, N), jnp.float32), jnp.ones((B, N), jnp.float32))  # fmt: skip
    cfg = StepConfig(loss=PolicyLoss.PPO, tis_cap=2.0)
    opt = optax.sgd(1e-3)
    m = sharding.make_mesh(data=1, devices=jax.devices()[:1])
    kl = {}
    for temperature in (0.7, 1.0):
        state = init_train_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(0), m)
        step = make_train_step(config, cfg, opt, m, shardings_of(state), temperature=temperature)
        _, metrics = step(state, batch, None, np.int32(1))
        kl[temperature] = float(metrics["sampler_kl"])
    print(f"sampler_kl: built at T=0.7 {kl[0.7]:.2e}, at T=1 {kl[1.0]:.2e}")
    assert kl[0.7] < 1e-6
    assert kl[1.0] > 1e-3


def test_temperature_must_be_a_positive_float():
    prompts, mask, tokens = _batch(BASE, 2, 4, 2, 3, seed=0)
    params = _params(BASE, seed=0)
    for bad in (0.0, -1.0, True):
        with pytest.raises(ValueError, match="temperature"):
            forward.completion_logprobs(params, BASE, prompts, mask, tokens, temperature=bad)


def test_vocab_parallel_head_equals_one_device():
    """The head on a 1x2x4 mesh of the 8 CPU devices (rows over fsdp 2, the vocabulary
    over tensor 4; per-device row chunks of 5 with a padded last one, vocabulary chunks
    of 4 with a tail in each device's 10 columns) against the same call without a mesh:
    log-probs, entropies and gradients of the hidden states and the head (an untied
    lm_head [D,V], stored (fsdp, tensor), enters as its transpose; a tied embedding is
    the same [V,D] operand)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from kjax import sharding

    config = dataclasses.replace(BASE, vocab_size=40, tie_embeddings=False)
    params = _params(config, seed=6)
    hidden = jax.random.normal(jax.random.key(3), (2, 4, 6, config.hidden_size))
    targets = jax.random.randint(jax.random.key(4), (2, 4, 6), 0, config.vocab_size)
    mesh = sharding.make_mesh(1, 2, 4)

    def loss(params, hidden):
        s = forward.chunked_token_stats(params, config, hidden, targets, with_entropy=True,
                                        chunk_rows=5, chunk_vocab=4)  # fmt: skip
        return jnp.sum(s.logprobs * jnp.cos(s.entropy)), s

    grads = jax.grad(loss, argnums=(0, 1), has_aux=True)

    def on_mesh(params, hidden):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            assert sharding.head_layout(48, 40) == (("fsdp",), ("tensor",))
            return grads(params, hidden)

    (ga, a), (gb, b) = (
        jax.jit(grads)(params, hidden),
        jax.jit(on_mesh)(*jax.device_put((params, hidden), NamedSharding(mesh, P()))),
    )
    assert float(jnp.std(a.logprobs)) > 0.3  # far from uniform: the test can fail
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(b.entropy, a.entropy, atol=1e-5, rtol=0)
    for x, y in zip(jax.tree.leaves(gb), jax.tree.leaves(ga), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5 * float(jnp.max(jnp.abs(y))) + 1e-7)


@pytest.mark.slow  # ~11 s on 2 cores (the mesh's forward and backward compile)
def test_sequence_split_residual_stream_equals_one_device():
    """The shared-prompt forward on a 1x2x4 mesh of the 8 CPU devices, where its residual
    stream between layers is split over tensor 4 along the S + N*T = 8 + 2*4 positions
    (sharding.constrain_residual, gather_sequence / scatter_sequence around each layer's
    projections), against the same call without a mesh: log-probs and the gradients of
    every parameter. A layout, so the values agree to float32 rounding."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from kjax import sharding

    config = dataclasses.replace(BASE, intermediate_size=64)
    params = _params(config, seed=7)
    prompts, pmask, tokens = _batch(config, B=2, S=8, N=2, T=4, seed=8)
    mesh = sharding.make_mesh(1, 2, 4)

    def loss(params):
        lp = forward.completion_logprobs(params, config, prompts, pmask, tokens).logprobs
        return jnp.sum(lp * jnp.cos(lp)), lp

    grads = jax.grad(loss, has_aux=True)

    def on_mesh(params):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), sharding.sequence_split(True):
            assert sharding._residual_axes((2, 16, 32), mesh, sharding.RULES) == (
                ("data", "fsdp"),
                ("tensor",),
            )
            return grads(params)

    (ga, a), (gb, b) = (
        jax.jit(grads)(params),
        jax.jit(on_mesh)(jax.device_put(params, NamedSharding(mesh, P()))),
    )
    assert float(jnp.std(a)) > 0.3  # far from uniform: the test can fail
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    for x, y in zip(jax.tree.leaves(gb), jax.tree.leaves(ga), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5 * float(jnp.max(jnp.abs(y))) + 1e-7)


def _constraints(jaxpr, shape):
    """Specs of every sharding_constraint on an array of `shape` in a jaxpr, its scans,
    checkpoints and custom rules included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "sharding_constraint" and eqn.outvars[0].aval.shape == shape:
            found.append(eqn.params["sharding"].spec)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _constraints(sub, shape)
    return found


def test_the_update_splits_its_residual_stream_over_tensor():
    """Traced for a 1x2x4 mesh (fsdp 2 x tensor 4) inside sharding.sequence_split(True)
    (rl.sequence_parallel), the shared-prompt forward's backward and forward lay the
    [B, S + N*T, D] residual stream between layers out split over tensor along its
    positions (sharding.constrain_residual), and outside it do not: the layer scan then keeps
    1/tensor of each layer's input per chip. Constrained only over the batch axes (as it
    was), the 70B CodeContests update on v5p-128 kept bf16[80,1,34304,8192] per chip,
    41.9 GiB, and did not fit. No compile: the traced program's constraints."""
    from kjax import sharding

    config = BASE
    params = jax.eval_shape(lambda: _params(config, seed=0))
    prompts, pmask, tokens = _batch(config, B=2, S=8, N=2, T=4, seed=0)
    mesh = sharding.make_mesh(1, 2, 4)

    def specs(on):
        def loss(params):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), sharding.sequence_split(on):
                lp = forward.completion_logprobs(params, config, prompts, pmask, tokens)[0]
                return jnp.sum(lp)

        jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
        return _constraints(jaxpr, (2, 16, config.hidden_size))

    split = jax.sharding.PartitionSpec(("data", "fsdp"), "tensor", None)
    assert split in specs(True), specs(True)
    assert split not in specs(False)  # rl.sequence_parallel off (the default): as before
