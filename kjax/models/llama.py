"""kjax's decoder in Flax NNX over a pure functional core: Llama 2/3.x and SmolLM2, and
as config fields (models/config.py) Qwen2/Qwen2.5, Qwen3 dense and Mistral.

Axes (see kjax/__init__.py): B batch, S query length, T key length (or cache length),
V vocab, D model dim, H heads, K kv heads; here also L layers, F MLP hidden, E head dim.

`Llama` only holds parameters (nnx.Param with logical `axes` metadata for
kjax.sharding); all math lives in pure functions of a params dict, the layout of
`nnx.to_pure_dict(nnx.state(model, nnx.Param))`:

  embed [V,D]   final_norm [D]   lm_head [D,V] (untied only)
  layers: attn_norm [L,D]  q [L,D,H,E]  k, v [L,D,K,E]  o [L,H,E,D]
          mlp_norm [L,D]  gate, up [L,D,F]  down [L,F,D]
          q_bias [L,H,E]  k_bias, v_bias [L,K,E]   (qkv_bias: Qwen2)
          q_norm, k_norm [L,E]                     (qk_norm: Qwen3, RMSNorm of each head)

Layers are stacked on a leading L axis and run with `lax.scan` (compile time does not
grow with depth). The building blocks a sampler composes (issue 4: prefill a prompt
once, share its K/V across N samples, decode in `lax.while_loop`):

  embed(params, tokens) -> x [B,S,D]
  rope_tables(config, positions [B,S]) -> (cos, sin) [B,S,E]
  layer_qkv(layer, config, x, cos, sin) -> q [B,S,H,E], k/v [B,S,K,E] (RoPE applied)
  layer_windows(config) -> [L] int32 window of each layer, or None (no sliding window);
      windowed(mask, window, q_pos, k_pos) narrows a mask to it inside the layer scan
  attention(q, k, v, mask [B,S,T], with_lse=True) -> out [B,S,H,E] (+ lse [B,S,H])
  merge_attention([(out, lse), ...]) -> out: softmax over key segments computed apart
      (shared prompt K/V and per-sample K/V) equals softmax over their concatenation
  layer_out(layer, config, x, out) -> x: output projection, residual, SwiGLU MLP
  unembed(params, config, x) -> logits [B,S,V] float32

`layer` is `jax.tree.map(lambda w: w[i], params["layers"])` (or the per-step slice
inside a scan). `forward` composes them; `prefill`/`decode_step` are a plain KV-cache
path over the same blocks. Sharing a prompt across N samples, per layer and step: the
[B,N] new queries, viewed as q [B,N,H,E], attend the prompt's k/v [B,S,K,E] once
(mask [B,N,S]); viewed as [B*N,1,H,E] they attend their own k/v [B*N,T,K,E]; both with
`with_lse=True`, then `merge_attention`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name as _name

from kjax.models.config import LlamaConfig

Params = dict[str, Any]
_NEG = float(jnp.finfo(jnp.float32).min)  # finite, so fully masked rows stay NaN-free


class Llama(nnx.Module):
    """Decoder parameters (any family) plus `__call__`; module docstring: the layout.

    Args:
      config: model hyperparameters.
      rngs: initializer randomness (normal(0, 0.02) weights, unit norms).
      param_dtype: storage dtype of the parameters.
      dtype: compute dtype (bfloat16 on accelerators); softmax and RMSNorm are float32.
      remat: recompute each block in the backward pass (long sequences).

    On CPU, `nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg"))` initializes much
    faster than the default threefry key (whose initializers each take ~1 s to compile).
    """

    def __init__(
        self,
        config: LlamaConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: jnp.dtype = jnp.float32,
        dtype: jnp.dtype = jnp.float32,
        remat: bool = False,
    ):
        self.config = config
        self.dtype = dtype
        self.remat = remat
        c = config
        init = nnx.initializers.normal(0.02)

        def param(shape, axes, ones=False):
            value = (
                jnp.ones(shape, param_dtype) if ones else init(rngs.params(), shape, param_dtype)
            )
            return nnx.Param(value, axes=axes)

        L, D, F = c.num_layers, c.hidden_size, c.intermediate_size
        H, K, E = c.num_heads, c.num_kv_heads, c.head_dim
        self.embed = param((c.vocab_size, D), ("vocab", "embed"))
        zeros = lambda shape, axes: nnx.Param(jnp.zeros(shape, param_dtype), axes=axes)  # noqa: E731
        extra = {}
        if c.qkv_bias:  # zero-initialized, as transformers does
            extra["q_bias"] = zeros((L, H, E), ("layers", "heads", "head_dim"))
            extra["k_bias"] = zeros((L, K, E), ("layers", "kv_heads", "head_dim"))
            extra["v_bias"] = zeros((L, K, E), ("layers", "kv_heads", "head_dim"))
        if c.qk_norm:  # one RMSNorm weight [E] per layer, shared by the heads
            extra["q_norm"] = param((L, E), ("layers", "head_dim"), ones=True)
            extra["k_norm"] = param((L, E), ("layers", "head_dim"), ones=True)
        self.layers = _Layers(
            **extra,
            attn_norm=param((L, D), ("layers", "norm"), ones=True),
            q=param((L, D, H, E), ("layers", "embed", "heads", "head_dim")),
            k=param((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim")),
            v=param((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim")),
            o=param((L, H, E, D), ("layers", "heads", "head_dim", "embed")),
            mlp_norm=param((L, D), ("layers", "norm"), ones=True),
            gate=param((L, D, F), ("layers", "embed", "mlp")),
            up=param((L, D, F), ("layers", "embed", "mlp")),
            down=param((L, F, D), ("layers", "mlp", "embed")),
        )
        self.final_norm = param((D,), ("norm",), ones=True)
        if not c.tie_embeddings:
            self.lm_head = param((D, c.vocab_size), ("embed", "vocab"))

    def params(self) -> Params:
        """The parameters as a plain nested dict of arrays (module-docstring layout)."""
        return nnx.to_pure_dict(nnx.state(self, nnx.Param))

    def __call__(self, tokens, positions=None, attention_mask=None):
        """Logits [B,S,V] float32 of tokens [B,S] int32; see `forward`."""
        return forward(
            self.params(),
            self.config,
            tokens,
            positions,
            attention_mask,
            dtype=self.dtype,
            remat=self.remat,
        )


class _Layers(nnx.Module):
    def __init__(self, **params: nnx.Param):
        for name, value in params.items():
            setattr(self, name, value)


# ----------------------------------------------------------------------------- blocks


def rms_norm(x, weight, eps: float):
    """RMSNorm of x [..., D] accumulated in float32, as transformers computes it."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def inv_frequencies(config: LlamaConfig):
    """RoPE inverse frequencies [E/2] float32, with llama3 scaling when configured."""
    E = config.head_dim
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, E, 2, dtype=jnp.float32) / E))
    s = config.rope_scaling
    if s is None:
        return inv
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, blended, scaled)


def rope_tables(config: LlamaConfig, positions):
    """cos, sin [B,S,E] float32 for positions [B,S] (HF's half-split layout)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_frequencies(config)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rotate(x, cos, sin):
    """Applies RoPE to x [B,S,N,E] (N heads) with cos/sin [B,S,E]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


def embed(params: Params, tokens, dtype=jnp.float32):
    """Token embeddings x [B,S,D] of tokens [B,S] int32."""
    return params["embed"].astype(dtype)[tokens]


def _dense(x, w, n_in: int = 1):
    """x [..., *in] @ w [*in, *out] as one 2-D matmul over all leading rows: XLA:CPU's
    3-D einsum backward was 1.34x slower than PyTorch's for the same MLP."""
    lead, inner = x.shape[: x.ndim - n_in], w.shape[:n_in]
    out = w.shape[n_in:]
    w2 = w.astype(x.dtype).reshape(math.prod(inner), math.prod(out))
    return (x.reshape(-1, w2.shape[0]) @ w2).reshape(*lead, *out)


def _project(x, layer: Params, name: str, n_in: int = 1):
    """Projection `name` of x: x W, plus s (x A) B when layer carries its LoRA adapters
    (kjax.models.lora). Unmerged, so an adapter update never forms the [in, out] weight
    gradient x^T dy of the frozen W, the slow matmul of a CPU update."""
    y = _dense(x, layer[name], n_in)
    if f"{name}_lora_a" not in layer:
        return y
    down = _dense(x, layer[f"{name}_lora_a"], n_in) * layer["lora_scale"].astype(x.dtype)
    return y + _dense(down, layer[f"{name}_lora_b"])


def layer_qkv(layer: Params, config: LlamaConfig, x, cos, sin, *, gather=None):
    """Pre-norm q [B,S,H,E], k [B,S,K,E], v [B,S,K,E] of x [B,S,D], RoPE on q and k.

    With qkv_bias the projections add their biases; with qk_norm each head of q and k is
    RMS-normalized over E (its own weight [E]) before RoPE, as Qwen3 does. `gather`, when
    given, is applied to the normed x before the projections (the sharded training
    forward passes kjax.sharding.gather_sequence: a layout, not a value, change).
    """
    h = rms_norm(x, layer["attn_norm"], config.rms_norm_eps)
    h = h if gather is None else gather(h)

    def project(name):
        y = _project(h, layer, name)
        if config.qkv_bias:
            y = y + layer[f"{name}_bias"].astype(y.dtype)
        return _name(y, name)

    q, k, v = project("q"), project("k"), project("v")
    if config.qk_norm:
        q = rms_norm(q, layer["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], config.rms_norm_eps)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


_NO_WINDOW = 2**30  # the window of a full-attention layer among sliding ones


def layer_windows(config: LlamaConfig):
    """Window [L] int32 of each layer (scanned beside the layer params), or None when no
    layer slides (then `windowed` is the identity and adds nothing to the graph)."""
    if config.sliding_window is None:
        return None
    return jnp.asarray(
        [config.sliding_window if s else _NO_WINDOW for s in config.window_layers], jnp.int32
    )


def windowed(mask, window, q_pos, k_pos):
    """mask [B|1,S,T] and, when window (int32 []) is not None, key position within the
    window: q_pos [B|1,S] - k_pos [B|1,T] < window (transformers' sliding_window_overlay,
    counted in positions: left padding is masked anyway). Leading dims broadcast."""
    if window is None:
        return mask
    return mask & (q_pos[..., :, None] - k_pos[..., None, :] < window)


def attention(q, k, v, mask, *, with_lse: bool = False):
    """Grouped-query softmax attention (float32 softmax).

    Args:
      q: [B,S,H,E] queries. k, v: [B,T,K,E] keys/values, H a multiple of K (query
        head h reads kv head h // (H/K), as transformers' repeat_kv).
      mask: [B,S,T] bool (B and S may be 1: broadcast), True where query s may attend
        key t.
      with_lse: also return the log-sum-exp [B,S,H] of the scores, for merge_attention.
    Returns:
      out [B,S,H,E] in q's dtype (and lse [B,S,H] float32).
    """
    B, S, H, E = q.shape
    T, K = k.shape[1], k.shape[2]
    G = H // K
    # Heads-major, the G query heads of a kv head next to the query axis: one batched
    # [G*S, E] x [E, T] matmul per (b, kv head), no K/V copies (1.3x faster fwd+bwd).
    qh = (q * (1 / math.sqrt(E))).reshape(B, S, K, G, E).transpose(0, 2, 3, 1, 4)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    mask = jnp.broadcast_to(mask, (mask.shape[0], S, T))[:, None, None]  # [B|1,1,1,S,T]
    core = _attention_core if S * T < RECOMPUTE_PROBS_AT else _attention_core_recompute
    out, lse = core(qh, kh, vh, mask)
    out = out.transpose(0, 3, 1, 2, 4).reshape(B, S, H, E)
    if not with_lse:
        return out
    return out, lse.transpose(0, 3, 1, 2).reshape(B, S, H)


@jax.custom_vjp
def _attention_core(qh, kh, vh, mask):
    """qh [B,K,G,S,E] (pre-scaled), kh/vh [B,K,T,E], mask [B|1,1,1,S,T] ->
    (out [B,K,G,S,E] in q's dtype, lse [B,K,G,S] float32)."""
    return _attention_fwd(qh, kh, vh, mask)[0]


def _softmax_probs(qh, kh, mask):
    """(probs [B,K,G,S,T] float32, top, total): the masked softmax of q k^T."""
    scores = jnp.einsum("bkgse,bkte->bkgst", qh, kh, preferred_element_type=jnp.float32)
    scores = jnp.where(mask, scores, _NEG)
    top = jnp.max(scores, axis=-1, keepdims=True)
    unnorm = jnp.exp(scores - top)
    total = jnp.sum(unnorm, axis=-1, keepdims=True)
    return unnorm / total, top, total


def _attention_fwd(qh, kh, vh, mask):
    probs, top, total = _softmax_probs(qh, kh, mask)
    out = jnp.einsum("bkgst,bkte->bkgse", probs.astype(vh.dtype), vh)
    lse = _name((top + jnp.log(total))[..., 0], "attn_lse")
    probs, out = _name(probs, "attn_probs"), _name(out, "attn_out")
    return (out, lse), (qh, kh, vh, probs, out)


def _attention_bwd(res, grads):
    # Softmax backward written out: the probabilities are kept (no recompute) and the
    # row term sum_t p dp is sum_e out * d_out; the lse cotangent adds p * d_lse.
    qh, kh, vh, probs, out = res
    d_out, d_lse = grads
    p = probs.astype(vh.dtype)
    d_v = jnp.einsum("bkgst,bkgse->bkte", p, d_out.astype(vh.dtype))
    d_p = jnp.einsum("bkgse,bkte->bkgst", d_out, vh, preferred_element_type=jnp.float32)
    row = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1, keepdims=True)
    d_s = (probs * (d_p - row + d_lse[..., None])).astype(qh.dtype)
    d_q = jnp.einsum("bkgst,bkte->bkgse", d_s, kh)
    d_k = jnp.einsum("bkgst,bkgse->bkte", d_s, qh)
    return d_q.astype(qh.dtype), d_k.astype(kh.dtype), d_v.astype(vh.dtype), None


_attention_core.defvjp(_attention_fwd, _attention_bwd)

# From S * T score entries per (row, head) on, the backward recomputes the probabilities
# from q, k and the saved log-sum-exp instead of keeping them: the float32 [B,H,S,T]
# probabilities of every layer are what overflowed a v5p chip at 70B (docs/scale.md),
# and one more q k^T per layer is their price. Below it (every CPU run of the tables:
# S * T <= ~10^4) nothing changes, so their results stay bit-identical.
RECOMPUTE_PROBS_AT = 1 << 20


@jax.custom_vjp
def _attention_core_recompute(qh, kh, vh, mask):
    """_attention_core whose backward recomputes the probabilities (long sequences)."""
    return _attention_fwd(qh, kh, vh, mask)[0]


def _recompute_fwd(qh, kh, vh, mask):
    probs, top, total = _softmax_probs(qh, kh, mask)
    out = jnp.einsum("bkgst,bkte->bkgse", probs.astype(vh.dtype), vh)
    lse = _name((top + jnp.log(total))[..., 0], "attn_lse")
    out = _name(out, "attn_out")
    return (out, lse), (qh, kh, vh, mask, out)


def _recompute_bwd(res, grads):
    # The same ops as the forward's, so the probabilities, and the gradients, are
    # bitwise those _attention_core keeps.
    qh, kh, vh, mask, out = res
    return _attention_bwd((qh, kh, vh, _softmax_probs(qh, kh, mask)[0], out), grads)


_attention_core_recompute.defvjp(_recompute_fwd, _recompute_bwd)


def merge_attention(parts):
    """Combines attention over disjoint key segments: [(out [B,S,H,E], lse [B,S,H])] -> out."""
    lses = jnp.stack([lse for _, lse in parts])
    weights = jax.nn.softmax(lses, axis=0)  # each segment's share of the total mass
    return sum(w[..., None].astype(o.dtype) * o for w, (o, _) in zip(weights, parts, strict=True))


def _same(x):
    return x


def layer_out(layer: Params, config: LlamaConfig, x, attn, *, gather=None, scatter=None):
    """Residual block tail: x + o(attn), then x + SwiGLU(norm(x)); x [B,S,D], attn [B,S,H,E].
    `gather` as in layer_qkv, on the MLP's normed input; `scatter`, when given, is
    applied to the o and down projections' outputs before they join x (a layout too)."""
    scatter = _same if scatter is None else scatter
    x = _name(x + scatter(_project(attn, layer, "o", n_in=2)), "x_mid")
    h = rms_norm(x, layer["mlp_norm"], config.rms_norm_eps)
    h = h if gather is None else gather(h)
    gate, up = _name(_project(h, layer, "gate"), "gate"), _name(_project(h, layer, "up"), "up")
    return x + scatter(_project(jax.nn.silu(gate) * up, layer, "down"))


def unembed(params: Params, config: LlamaConfig, x):
    """Logits [B,S,V] float32 of final hidden states x [B,S,D]."""
    h = rms_norm(x, params["final_norm"], config.rms_norm_eps)
    head = params["embed"].T if config.tie_embeddings else params["lm_head"]
    logits = jnp.matmul(h.reshape(-1, h.shape[-1]), head.astype(x.dtype),
                        preferred_element_type=jnp.float32)  # fmt: skip
    return logits.reshape(*x.shape[:-1], -1)


# ----------------------------------------------------------------------------- forward


def default_positions(attention_mask):
    """Positions [B,S] int32 counting only real tokens: left padding starts at 0."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(
    params: Params,
    config: LlamaConfig,
    tokens,
    positions=None,
    attention_mask=None,
    *,
    dtype=jnp.float32,
    remat: bool = False,
):
    """Full causal forward pass.

    Args:
      params: the parameter dict (module docstring).
      tokens: [B,S] int32.
      positions: [B,S] int32 RoPE positions; default counts real tokens (left padding).
      attention_mask: [B,S] bool/int, 0 on padding keys; default all ones.
    Returns:
      logits [B,S,V] float32 (rows of padding positions are meaningless).
    """
    B, S = tokens.shape
    if attention_mask is None:
        attention_mask = jnp.ones((B, S), bool)
    attention_mask = attention_mask.astype(bool)
    if positions is None:
        positions = default_positions(attention_mask)
    mask = jnp.tril(jnp.ones((S, S), bool))[None] & attention_mask[:, None, :]
    cos, sin = rope_tables(config, positions)

    def block(x, inputs):
        layer, window = inputs
        q, k, v = layer_qkv(layer, config, x, cos, sin)
        m = windowed(mask, window, positions, positions)
        return layer_out(layer, config, x, attention(q, k, v, m)), None

    xs = (params["layers"], layer_windows(config))
    x = scan_layers(block, embed(params, tokens, dtype), xs, remat=remat)
    return unembed(params, config, x)


# What a layer's backward reads, named where it is computed (checkpoint_name is the
# identity outside jax.checkpoint): the q/k/v projections, the attention probabilities,
# output and log-sum-exp, the residual after attention, the MLP's gate and up. Norms,
# RoPE, transposes and the SiLU are recomputed from them in the backward, so the dots
# stay saved and only elementwise work repeats.
SAVED_RESIDUALS = ("q", "k", "v", "attn_probs", "attn_out", "attn_lse", "x_mid", "gate", "up")


def scan_layers(block, x, layers, *, remat: bool = False):
    """x after `block(x, layer) -> (x, None)` over the stacked layers (lax.scan).

    The backward keeps SAVED_RESIDUALS per layer (remat=False) or only each layer's
    input (remat=True: the whole block is recomputed). Plain autodiff of the scan kept
    every intermediate (~145 vs ~57 MB per layer at the SmolLM2 shape, [16,128]; XLA's
    temporaries for the whole step 4,692 vs 2,064 MiB), and zero-filling and writing
    those stacked buffers cost more than the elementwise recompute: fwd+bwd there went
    20.6 -> 18.9 s (medians of 5, one run, 2 CPU cores).
    """
    if remat:
        block = jax.checkpoint(block)
    else:
        policy = jax.checkpoint_policies.save_only_these_names(*SAVED_RESIDUALS)
        block = jax.checkpoint(block, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(block, x, layers)
    return x


# ----------------------------------------------------------------------------- KV cache


class KVCache(NamedTuple):
    """Per-layer keys/values of a batch: k, v [L,B,T,K,E]; valid [B,T] bool marks
    written non-padding slots; `end` int32 is the next slot; `next_pos` [B] int32 the
    RoPE position of each row's next token."""

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    end: jax.Array
    next_pos: jax.Array


def prefill(
    params: Params, config: LlamaConfig, tokens, attention_mask, max_len: int, *, dtype=jnp.float32
):
    """Runs a left-padded prompt batch and returns (logits [B,S,V], KVCache of T=max_len).

    Args:
      tokens: [B,S] int32. attention_mask: [B,S] bool/int, 0 on (left) padding.
      max_len: cache length T >= S (prompt plus tokens to decode).
    """
    B, S = tokens.shape
    if max_len < S:
        raise ValueError(f"max_len={max_len} is shorter than the prompt length {S}")
    attention_mask = attention_mask.astype(bool)
    positions = default_positions(attention_mask)
    mask = jnp.tril(jnp.ones((S, S), bool))[None] & attention_mask[:, None, :]
    cos, sin = rope_tables(config, positions)
    pad = ((0, 0), (0, max_len - S), (0, 0), (0, 0))

    def block(x, inputs):
        layer, window = inputs
        q, k, v = layer_qkv(layer, config, x, cos, sin)
        m = windowed(mask, window, positions, positions)
        x = layer_out(layer, config, x, attention(q, k, v, m))
        return x, (jnp.pad(k, pad), jnp.pad(v, pad))

    xs = (params["layers"], layer_windows(config))
    x, (ks, vs) = jax.lax.scan(block, embed(params, tokens, dtype), xs)
    valid = jnp.pad(attention_mask, ((0, 0), (0, max_len - S)))
    cache = KVCache(ks, vs, valid, jnp.int32(S), positions[:, -1] + 1)
    return unembed(params, config, x), cache


def decode_step(params: Params, config: LlamaConfig, token, cache: KVCache, *, dtype=jnp.float32):
    """Feeds one token per row: token [B] int32 -> (logits [B,V] float32, updated cache)."""
    x = embed(params, token[:, None], dtype)
    cos, sin = rope_tables(config, cache.next_pos[:, None])
    valid = jax.lax.dynamic_update_slice(
        cache.valid, jnp.ones((token.shape[0], 1), bool), (0, cache.end)
    )
    k_pos = default_positions(valid)  # real slots are contiguous: they count positions

    def block(x, inputs):
        layer, window, k_cache, v_cache = inputs
        q, k, v = layer_qkv(layer, config, x, cos, sin)
        k_cache = jax.lax.dynamic_update_slice(
            k_cache, k.astype(k_cache.dtype), (0, cache.end, 0, 0)
        )
        v_cache = jax.lax.dynamic_update_slice(
            v_cache, v.astype(v_cache.dtype), (0, cache.end, 0, 0)
        )
        mask = windowed(valid[:, None, :], window, cache.next_pos[:, None], k_pos)
        out = attention(q, k_cache, v_cache, mask)
        return layer_out(layer, config, x, out), (k_cache, v_cache)

    xs = (params["layers"], layer_windows(config), cache.k, cache.v)
    x, (ks, vs) = jax.lax.scan(block, x, xs)
    new = KVCache(ks, vs, valid, cache.end + 1, cache.next_pos + 1)
    return unembed(params, config, x)[:, 0], new
