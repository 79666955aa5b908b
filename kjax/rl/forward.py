"""Per-token log-probabilities (and entropies) of sampled completions under the policy.

`completion_logprobs(params, config, prompts [B,S], prompt_mask [B,S], tokens [B,N,T])`
-> TokenStats(logprobs [B,N,T], entropy [B,N,T] | None), both float32. Positions count
real (non-padding) prompt tokens, as the sampler does, so these are the sampler's raw
model log-probs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kjax.models import llama
from kjax.models.config import LlamaConfig


class TokenStats(NamedTuple):
    """logprobs [B,N,T] float32: log pi(token_t | prompt, tokens_<t);
    entropy [B,N,T] float32 of pi(. | prompt, tokens_<t), or None when not asked."""

    logprobs: jax.Array
    entropy: jax.Array | None


def _repeated_logits(params, config, prompts, prompt_mask, tokens, dtype):
    """Reference path: logits [B,N,T,V] from one forward over [B*N, S+T] (prompt repeated)."""
    B, N, T = tokens.shape
    S = prompts.shape[1]
    seq = jnp.concatenate([jnp.repeat(prompts, N, axis=0), tokens.reshape(B * N, T)], axis=1)
    attn = jnp.concatenate(
        [jnp.repeat(prompt_mask.astype(bool), N, axis=0), jnp.ones((B * N, T), bool)], axis=1
    )
    logits = llama.forward(params, config, seq, attention_mask=attn, dtype=dtype)
    return logits[:, S - 1 : S + T - 1].reshape(B, N, T, -1)


def _stats_of_logits(logits, tokens, with_entropy: bool) -> TokenStats:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    lp = jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1) if with_entropy else None
    return TokenStats(lp, ent)


def completion_logprobs(
    params,
    config: LlamaConfig,
    prompts,
    prompt_mask,
    tokens,
    *,
    dtype=jnp.float32,
    shared_prompt: bool = True,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> TokenStats:
    """Token log-probs (and entropies) of completions tokens [B,N,T] after prompts [B,S].

    Args:
      params, config: the policy (kjax.models.llama layout).
      prompts: [B,S] int32, left-padded. prompt_mask: [B,S] bool/int, 0 on padding.
      tokens: [B,N,T] int32, N completions per prompt.
      dtype: compute dtype of the model (log-probs are float32 regardless).
      shared_prompt: run each prompt once and let its N completions attend its K/V
        (False: the reference path, prompt repeated N times).
      with_entropy: also return per-token entropies.
      chunk_rows: rows (of B*N*T) per log-prob chunk; None picks a default.
    Returns:
      TokenStats(logprobs [B,N,T] float32, entropy [B,N,T] float32 or None).
    """
    del shared_prompt, chunk_rows  # first version: the reference path for every flag
    logits = _repeated_logits(params, config, prompts, prompt_mask, tokens, dtype)
    return _stats_of_logits(logits, tokens, with_entropy)
