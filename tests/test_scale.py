"""kjax's update and sampler compiled by the real TPU compiler for a v5e:2x2 slice on this
CPU host (kjax.scale; needs libtpu, `pip install -e '.[tpu]'`): per-chip bytes against
sizes computed by hand, FLOPs against closed forms."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import hlo_stats, scale, sharding
from kjax.models.config import LlamaConfig
from kjax.rl.config import ArithConfig, ModelConfig, TrainConfig

pytestmark = pytest.mark.skipif(
    scale.libtpu_missing() is not None,
    reason=f"{scale.libtpu_missing()}: no TPU compiler to compile for a TPU topology",
)

# Every sharded dimension divides evenly on data=1, fsdp=2, tensor=2.
CONFIG = LlamaConfig(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    tie_embeddings=True,
    eos_ids=(1,),
    max_position_embeddings=64,
)
# By hand, rules vocab/heads/kv_heads/mlp -> tensor (2), embed -> fsdp (2), float32:
#   embed [32,64] -> [16,32]: 512    final_norm [64]: 64    attn_norm, mlp_norm [2,64]: 2 x 128
#   q [2,64,4,16] -> [2,32,2,16]: 2048    k, v [2,64,2,16] -> [2,32,1,16]: 2 x 1024
#   o [2,4,16,64] -> [2,2,16,32]: 2048    gate, up [2,64,128] -> [2,32,64]; down: 3 x 4096
PARAM_ELEMENTS_PER_CHIP = 512 + 64 + 2 * 128 + 2048 + 2 * 1024 + 2048 + 3 * 4096
CFG = TrainConfig(
    batch_prompts=8,
    samples=4,
    max_new_tokens=4,
    task=ArithConfig(max_prompt_tokens=8),
    model=ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128),
)


@pytest.fixture(scope="module")
def plan():
    return scale.plan(CFG, CONFIG, "v5e:2x2", (1, 2, 2), microbatches=1)


def test_topology_devices_are_four_v5e_chips():
    devices = scale.topology_devices("v5e:2x2")
    assert len(devices) == 4 and scale.topology_chips("v5e:2x2") == 4
    assert {d.device_kind for d in devices} == {"TPU v5 lite"}
    assert jax.devices()[0].platform == "cpu"  # the suite itself stays on the CPU


def test_per_chip_parameter_bytes_are_the_sharded_sizes(plan):
    assert plan.params_bytes == 4 * PARAM_ELEMENTS_PER_CHIP
    # Adam's two moments are laid out like the params; Adam's and the learning-rate
    # schedule's step counts are one int32 each.
    assert plan.opt_bytes == 2 * 4 * PARAM_ELEMENTS_PER_CHIP + 2 * 4
    # The compiler's own figure: arguments hold at least the params, moments and batch.
    assert plan.update.argument_bytes >= plan.params_bytes + plan.opt_bytes
    assert plan.fits and plan.peak_bytes < 16 * scale.GiB


def test_update_and_decode_flops_match_their_closed_forms(plan):
    # PG, one update: forward + backward = 3 forwards of the shared-prompt pass.
    assert plan.update_model_flops == 3 * scale.forward_flops(CONFIG, plan.shape)
    # On an fsdp-only mesh the compiled update is exactly the closed form. With tensor
    # sharding it compiles to more (1.19x here at fsdp 2 x tensor 2, 1.08x at tensor 4):
    # an open finding of docs/scale.md, so this mesh is not held to 1.0.
    fsdp_only = scale.plan(CFG, CONFIG, "v5e:2x2", (1, 4, 1), microbatches=1)
    assert fsdp_only.update_flops_ratio == pytest.approx(1.0, abs=0.03)
    assert plan.update_flops_ratio >= 0.97
    for compiled, model in zip(plan.decode, plan.decode_model_flops, strict=True):
        assert compiled.flops == pytest.approx(model / plan.chips, rel=0.03)


def test_kv_cache_bytes_by_hand(plan):
    # prompt [L=2, B=8, S=8, K=2, E=16] + own [2, B*N=32, 16, 2, 16] (T-1=3 slots padded
    # to 16 on TPU, sampling.own_slots), k and v, float32, rows over data*fsdp = 2, kv
    # heads over tensor = 2.
    assert scale.planner.sampling.own_slots(4, tpu=True) == 16
    per_chip = (2 * 8 * 8 * 2 * 16 + 2 * 32 * 16 * 2 * 16) // 4
    assert plan.kv_bytes == 2 * 4 * per_chip


def test_kv_cache_rows_take_tensor_when_it_cannot_split_the_kv_heads(plan):
    """tensor 4 and 2 kv heads: the heads stay whole and the cache's rows go over tensor
    (sharding.cache_spec), so each chip holds a quarter of the cache as on fsdp 2 x
    tensor 2, not its batch group's whole cache (the 8B sampler on v5e-256 needed 33 GiB
    per chip that way)."""
    tensor4 = scale.plan(CFG, CONFIG, "v5e:2x2", (1, 1, 4), microbatches=1)
    assert tensor4.kv_bytes == plan.kv_bytes
    # The compiler's own figures: the donated cache comes back as large as on the
    # 2 x 2 mesh (tile padding aside), and the prefill's output no larger either.
    for four, two in zip(tensor4.decode, plan.decode, strict=True):
        assert four.output_bytes <= 1.1 * two.output_bytes
    assert tensor4.prefill.output_bytes <= 1.1 * plan.prefill.output_bytes


def test_hlo_stats_counts_a_sharded_scan_per_trip():
    """L matmuls [R,D] @ [D,D] in a scan, weights fsdp-sharded (the partitioner may add a
    windowed-matmul loop inside the scan loop): counted per trip, R/4 rows per chip."""
    mesh = sharding.make_mesh(1, 4, 1, devices=scale.topology_devices("v5e:2x2"))
    R, D, L = 512, 256, 3
    x = jax.ShapeDtypeStruct((R, D), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
    w = jax.ShapeDtypeStruct((L, D, D), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "fsdp")))

    def f(x, w):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

    stats = hlo_stats.module_stats(jax.jit(f).lower(x, w).compile().as_text())
    assert stats.flops == 2 * (R // 4) * D * D * L
    assert stats.unbounded_loops == 0


def test_plan_refuses_a_batch_that_does_not_split():
    cfg = dataclasses.replace(CFG, batch_prompts=6)
    with pytest.raises(ValueError, match="do not split"):
        scale.plan(cfg, CONFIG, "v5e:2x2", (1, 4, 1), microbatches=1)


@pytest.mark.slow
def test_llama31_8b_update_fits_a_v5p_8_slice():
    """The 8B MATH preset's update (PPO 2 epochs x 2 minibatches, N=16, T=1024) on
    v5p:2x2x2 with tensor=8 and one prompt group per chip and microbatch: it fits 95 GiB
    (compile ~10 min on 2 loaded cores)."""
    from experiments.plan_scale import KNOWN_MODELS
    from experiments.train import load_config
    from kjax.rl.optim import make_optimizer

    c = LlamaConfig.from_hf(KNOWN_MODELS["llama-3.1-8b"])
    cfg = load_config("experiments/configs/llama31_8b_math.py:passk")
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, microbatches=64))
    mesh = sharding.make_mesh(1, 1, 8, devices=scale.topology_devices("v5p:2x2x2"))
    params = scale.abstract_params(c, scale.param_dtype(cfg), mesh)
    state = scale.abstract_state(params, make_optimizer(cfg.optimizer), mesh)
    update = scale.compile_update(cfg, c, mesh, state, scale.Shape.of(cfg))
    assert update.overflow is None
    assert update.peak_bytes <= scale.CHIPS["v5p"].hbm_bytes
    # bfloat16 params, 8-way sharded: 2 bytes x 8.03e9 / 8 (norms replicated: tiny).
    assert scale.per_chip_bytes(params) == pytest.approx(2 * scale.param_count(c) / 8, rel=1e-3)


@pytest.mark.skipif(
    scale.libtpu_missing("h100:8") is not None,
    reason="jax-cuda12-plugin is not installed (the GPU compiler; optional)",
)
def test_update_compiles_for_eight_h100s_without_a_gpu():
    plan = scale.plan(CFG, CONFIG, "h100:8", (1, 4, 2), microbatches=1)
    # By hand on fsdp 4 x tensor 2: embed [16,16] 256, final_norm 64, norms 2 x 128,
    # q and o 2 x 1024, k and v 2 x 512, gate, up and down 3 x 2048.
    assert plan.params_bytes == 4 * (256 + 64 + 256 + 2 * 1024 + 2 * 512 + 3 * 2048)
    assert plan.fits


def test_a_decode_step_the_compiler_refused_means_it_does_not_fit(plan):
    """A decode step that ran out of HBM on its own is a plan that does not fit, even
    when the whole sampler compiled with a smaller reported peak (70B on v5p-128 came
    out 'fits' that way)."""
    assert plan.fits
    refused = dataclasses.replace(plan.decode[1], overflow="RESOURCE_EXHAUSTED: Ran out of memory")
    small = dataclasses.replace(plan.decode[0], name="sampler", temp_bytes=0)
    bad = dataclasses.replace(plan, decode=(plan.decode[0], refused), sampler=small)
    assert not bad.fits
    assert bad.sampler_peak >= refused.peak_bytes
