"""Attention through kernels where the platform has them, behind one function.

`grouped_attention(backend, q, k, v, prompt_mask, n, t)` attends a row laid out as one
prompt of S positions followed by n blocks of t completion positions, L = S + n*t (the
shared-prompt training forward, kjax/rl/forward.py; n*t = 0 is a plain causal prompt,
the sampler's prefill): prompt query i sees real prompt keys j <= i; completion query
(m, s) sees every real prompt key and keys (m, s' <= s) of its own block. That is the
mask the jnp reference builds from three llama.attention calls and an LSE merge.

Backends (config.AttentionBackend; `resolve` picks one at trace time):
- SPLASH: Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention),
  one call with the mask above computed inside the kernel (so only blocks with an
  unmasked entry are computed) and prompt padding as segment ids. Its log-sum-exp
  output cannot be differentiated (its VJP rejects save_residuals=True), which is why
  the kernel gets the whole mask instead of kjax's prompt/own LSE merge. Under a mesh
  it runs in a shard_map: rows over the batch axes, heads over tensor.
- CUDNN: `jax.nn.dot_product_attention(implementation="cudnn")`, twice: the prompt
  (causal, padding) and each sample over [its prompt ++ its own block] (the prompt K/V
  repeated per sample, n*S*K*E per layer) with a dense mask; cuDNN's residual LSE has
  no gradient either.
Off their platform (CPU tests) SPLASH runs in Pallas interpret mode and CUDNN as the
same call's XLA implementation, so both are checked against the reference on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from kjax import sharding
from kjax.models.config import AttentionBackend, LlamaConfig

# AUTO uses a kernel from this many positions per row (S + n*t) on: splash pads a row
# to whole 128-wide blocks, and below one 512 block the kernel saves little (and the
# tiny TPU programs of tests/test_scale.py keep their closed-form FLOPs).
KERNEL_MIN_LENGTH = 512
BLOCK = 512  # splash block (q, kv, backward); MaxText's default is 512 as well


def platform() -> str:
    """The platform traced for: the mesh's devices when traced under one (a TPU topology
    compiled on a CPU host says "tpu"), else the default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def resolve(config: LlamaConfig, dtype, length: int) -> AttentionBackend:
    """The backend (JNP, SPLASH or CUDNN) for rows of `length` positions in `dtype`.

    AUTO: SPLASH on TPU from KERNEL_MIN_LENGTH positions and without a sliding window;
    JNP otherwise (so every CPU run is the reference). AUTO does not pick CUDNN on GPU
    yet: its call has not been compiled for a GPU target here (docs/models.md); name it
    to use it. A named kernel that cannot run this model raises ValueError naming the
    field.
    """
    backend = config.attention
    if backend is AttentionBackend.JNP:
        return backend
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    if backend is AttentionBackend.AUTO:
        where = platform()
        if config.sliding_window is not None or length < KERNEL_MIN_LENGTH:
            return AttentionBackend.JNP
        return AttentionBackend.SPLASH if where == "tpu" else AttentionBackend.JNP
    if config.sliding_window is not None:
        raise ValueError(
            f"attention={backend.value} does not implement sliding windows "
            f"(sliding_window={config.sliding_window}); use attention=jnp or auto"
        )
    if backend is AttentionBackend.CUDNN and platform() in ("gpu", "cuda") and not half:
        raise ValueError(
            f"attention=cudnn needs a bfloat16/float16 compute dtype, got {jnp.dtype(dtype)}; "
            "use model.dtype=bfloat16, or attention=jnp or auto"
        )
    return backend


def grouped_attention(backend: AttentionBackend, q, k, v, prompt_mask, n: int, t: int):
    """Attention of a prompt-then-n-blocks row (module docstring) through a kernel.

    Args:
      backend: SPLASH or CUDNN (`resolve`'s choice).
      q: [B,L,H,E] queries, L = S + n*t (RoPE applied, not scaled). k, v: [B,L,K,E].
      prompt_mask: [B,S] bool, False on prompt padding (each row needs a real token).
      n, t: the completion blocks (n*t = 0: the prompt alone).
    Returns:
      out [B,L,H,E] in q's dtype; rows of prompt padding are meaningless.
    """
    B, L, H, E = q.shape
    S = prompt_mask.shape[1]
    if L != S + n * t:
        raise ValueError(f"q [B,L,H,E] {q.shape} needs L = S + n*t = {S} + {n}*{t}")
    if backend is AttentionBackend.SPLASH:
        return _splash_attention(q, k, v, prompt_mask, n, t, interpret=platform() != "tpu")
    if backend is AttentionBackend.CUDNN:
        impl = "cudnn" if platform() in ("gpu", "cuda") else "xla"
        return _dot_product_attention(q, k, v, prompt_mask, n, t, impl)
    raise ValueError(f"grouped_attention runs a kernel; got backend {backend}")


# ----------------------------------------------------------------------------- splash


@functools.cache
def _splash():
    """jax's splash module, imported on first use (0.4 s; CPU runs never need it)."""
    from jax.experimental.pallas.ops.tpu import splash_attention

    return splash_attention


def shared_prompt_mask(length: int, prompt: int, block: int):
    """kjax's shared-prompt mask [length, length] as a splash Mask (padding aside): kv <= q,
    and kv in the prompt (the first `prompt` positions) or in q's own `block`-wide block
    (block 0: causal only). Computed in the kernel from the indices (a mask_function), so
    no [L, L] array is stored. Positions past the last block (splash's padding) form
    blocks of their own."""
    return _mask_class()(length, prompt, block)


@functools.cache
def _mask_class():
    class SharedPromptMask(_splash().Mask):
        def __init__(self, length: int, prompt: int, block: int):
            self.prompt, self.block = prompt, block
            self._shape = (length, length)
            self.q_sequence = np.arange(length, dtype=np.int32)  # read by splash

            def mask_function(q_ids, kv_ids):
                causal = q_ids >= kv_ids
                if block == 0:
                    return causal
                own = (kv_ids - prompt) // block == (q_ids - prompt) // block
                return causal & ((kv_ids < prompt) | own)

            self.mask_function = mask_function

        @property
        def shape(self):
            return self._shape

        def __getitem__(self, idx):
            rows, cols = (np.arange(n)[s] for n, s in zip(self._shape, idx, strict=True))
            return self.mask_function(rows[:, None], cols[None, :])

        def _key(self):
            return (self._shape, self.prompt, self.block)

        def __eq__(self, other):
            return isinstance(other, SharedPromptMask) and self._key() == other._key()

        def __hash__(self):
            return hash((SharedPromptMask, self._key()))

    return SharedPromptMask


@functools.lru_cache(maxsize=16)
def _kernel(length: int, prompt: int, block: int, heads: int, interpret: bool):
    """A splash kernel for [heads, length, E] rows (block-sparse mask info built once).

    Built eagerly (jax.ensure_compile_time_eval) even when first asked for inside a trace:
    the kernel holds its mask info as arrays, and arrays made inside one trace are that
    trace's tracers, which this cache would hand to every later trace (an
    UnexpectedTracerError in the next jit of the same shapes)."""
    splash = _splash()
    b = min(BLOCK, length)
    sizes = splash.BlockSizes(
        block_q=b, block_kv=b, block_kv_compute=b,
        block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
        block_q_dq=b, block_kv_dq=b,
    )  # fmt: skip
    mask = splash.MultiHeadMask([shared_prompt_mask(length, prompt, block)] * heads)
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
            residual_checkpoint_name="attn_out", interpret=interpret,
        )  # fmt: skip


def _splash_attention(q, k, v, prompt_mask, n, t, *, interpret: bool):
    B, L, H, E = q.shape
    S, K = prompt_mask.shape[1], k.shape[2]
    # Rows padded to whole blocks (128 lanes; 512 once longer); pad positions are
    # segment -1, prompt padding 0, real positions 1: a segment only sees its own.
    width = 128 if L <= 128 else BLOCK if L >= BLOCK else 128
    Lp = -(-L // width) * width
    seg = jnp.concatenate(
        [prompt_mask.astype(jnp.int32), jnp.ones((B, n * t), jnp.int32),
         jnp.full((B, Lp - L), -1, jnp.int32)], axis=1,
    )  # fmt: skip

    def heads_major(a):  # [B,L,., E] -> [B,.,Lp,E]
        return jnp.pad(a, ((0, 0), (0, Lp - L), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    qh = heads_major(q * jnp.asarray(1 / math.sqrt(E), q.dtype))  # as llama.attention
    kh, vh = heads_major(k), heads_major(v)

    def run(qh, kh, vh, seg):
        kernel = _kernel(Lp, S, t if n else 0, qh.shape[1], interpret)
        ids = _splash().SegmentIds(q=seg, kv=seg)
        return jax.vmap(lambda *a: kernel(*a[:3], segment_ids=a[3]))(qh, kh, vh, ids)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        run, kh, vh = _sharded(run, mesh, B, H, K, kh, vh)
    out = run(qh, kh, vh, seg)
    return out.transpose(0, 2, 1, 3)[:, :L]


def kv_repeat(num_heads: int, num_kv_heads: int, rules=sharding.RULES) -> int:
    """How many times each kv head is repeated under the traced mesh so that every
    device of the heads rule's axes (tensor) holds one: tensor / K where tensor divides
    the H query heads and is a multiple of the K kv heads (8B, 8 kv heads, on tensor 32:
    4; 70B on tensor 16: 2), else 1 (and 1 without a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    heads = tuple(n for n in sharding._axes_of(rules["heads"], mesh) if mesh.shape[n] > 1)
    size = sharding._size(heads, mesh)
    if size > num_kv_heads and num_heads % size == 0 and size % num_kv_heads == 0:
        return size // num_kv_heads
    return 1


# A layer's k/v weights with their kv-heads axis: (name, that axis in one layer's slice).
_KV_HEAD_AXIS = {"k": 1, "v": 1, "k_bias": 0, "v_bias": 0, "k_lora_b": 1, "v_lora_b": 1}


def kv_weights_per_query_head(layer, num_heads: int, num_kv_heads: int, rules=sharding.RULES):
    """One layer's weights ({name: array}, kjax.models.llama's layout, the layer axis
    dropped) with the k and v projections (their biases and LoRA B factors too) each
    head repeated `kv_repeat` times and laid out heads over tensor, where that is > 1;
    `layer` as is otherwise. k = x repeat(W_k) equals repeat(x W_k), and query head h
    reads repeated head h // (H / (K g)), a copy of kv head h // (H / K): the values are
    unchanged.

    Why: the splash kernel then gets one kv head per tensor device, split like the query
    heads. Repeating the activations k and v to H heads instead (what `_sharded` does)
    left the partitioner to sum the repeated heads' gradients back onto 8 kv heads that
    tensor 32 cannot split: every chip then computed the whole k and v weight gradient
    and input gradient (8B MATH on v5e-256, mesh 1x8x32: the update's FLOPs 1.66x the
    analytic count). Here each chip computes its one kv head's k and v, forward and
    backward (tensor / K times the plain projections' FLOPs over all chips)."""
    g = kv_repeat(num_heads, num_kv_heads, rules)
    if g == 1:
        return layer
    mesh = jax.sharding.get_abstract_mesh()
    out = dict(layer)
    for name, axis in _KV_HEAD_AXIS.items():
        if name not in layer:
            continue
        w = jnp.repeat(layer[name], g, axis=axis)
        logical = [None] * w.ndim
        logical[axis] = "heads"
        spec = sharding.logical_to_spec(logical, w.shape, mesh, rules)
        out[name] = jax.lax.with_sharding_constraint(w, spec)
    return out


def _sharded(run, mesh, B, H, K, kh, vh):
    """`run` in a shard_map over `mesh`: rows over the batch axes and heads over the
    kv_heads axes where they divide B and H (GSPMD cannot split a Pallas call; left to
    it, every chip ran every row). Where tensor divides H but not K the kv heads are
    repeated to H first (query head h reads kv head h // (H/K) either way)."""
    batch = sharding._axes_of(sharding.RULES["batch"], mesh)
    batch = batch if B % sharding._size(batch, mesh) == 0 else ()
    heads = tuple(a for a in sharding._axes_of(sharding.RULES["heads"], mesh) if a not in batch)
    size = sharding._size(heads, mesh)
    if size > 1 and H % size == 0 and K % size:
        kh, vh = (jnp.repeat(a, H // K, axis=1) for a in (kh, vh))
    elif H % size:
        heads = ()
    spec = PartitionSpec(batch or None, heads or None)
    seg = PartitionSpec(batch or None)
    mapped = jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, seg), out_specs=spec,
                           check_vma=False)  # fmt: skip
    return mapped, kh, vh


# ----------------------------------------------------------------------------- cuDNN


def _dot_product_attention(q, k, v, prompt_mask, n, t, impl: str):
    """The prompt's causal attention, then each sample's queries over [prompt ++ own]
    keys, through jax.nn.dot_product_attention (mask [B,1,Sq,Sk]). A prompt padding
    query also sees itself, so no row is empty (real rows are unchanged)."""
    B, L, H, E = q.shape
    S = prompt_mask.shape[1]
    pmask = prompt_mask.astype(bool)
    attend = functools.partial(jax.nn.dot_product_attention, implementation=impl)
    causal = jnp.tril(jnp.ones((S, S), bool))
    m_p = (causal[None] & pmask[:, None, :]) | jnp.eye(S, dtype=bool)[None]
    out_p = attend(q[:, :S], k[:, :S], v[:, :S], mask=m_p[:, None])
    if n * t == 0:
        return out_p
    qc = q[:, S:].reshape(B * n, t, H, E)
    kv = [
        jnp.concatenate(
            [jnp.repeat(a[:, :S], n, axis=0), a[:, S:].reshape(B * n, t, *a.shape[2:])], axis=1
        )  # fmt: skip
        for a in (k, v)
    ]
    m_c = jnp.concatenate(
        [jnp.repeat(jnp.broadcast_to(pmask[:, None, :], (B, t, S)), n, axis=0),
         jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (B * n, t, t))], axis=-1,
    )  # fmt: skip
    out_c = attend(qc, *kv, mask=m_c[:, None])
    return jnp.concatenate([out_p, out_c.reshape(B, n * t, H, E)], axis=1)
