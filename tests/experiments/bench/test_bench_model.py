"""The FLOP count behind experiments/bench/bench_model.py's MFU column, checked by hand."""

from experiments.bench import bench_model
from kjax.models import LlamaConfig

TINY = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    tie_embeddings=True,
)


def test_flops_per_token_by_hand():
    # per layer: q,k,v,o = 16*4*(2*4 + 2*2) = 768; mlp = 3*16*24 = 1152; head = 16*32 = 512
    matmul_params = 2 * (768 + 1152) + 512
    attention = 2 * 2 * 2 * 10 * 4 * 4  # layers * (scores + values) * 2 FLOPs * S * H * E
    assert bench_model.model_flops_per_token(TINY, seq=10) == 2 * matmul_params + attention
