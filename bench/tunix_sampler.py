"""Tunix's side of `experiments.bench_sampler --tunix_python=...`: its Sampler, timed.

  /tmp/tunixenv/bin/python bench/tunix_sampler.py --jobs=64x1x64x64,8x8x64x64 --out=t.json

Run by a separate environment's python holding google-tunix (and the jax/flax it pins;
never kjax): `python3 -m venv /tmp/tunixenv && /tmp/tunixenv/bin/pip install google-tunix`.
The model is Tunix's own Llama3 (`tunix.models.llama3.model.Llama3`) at the SmolLM2-135M
shape with random weights (`create_dummy_model`), float32, as kjax's side uses. Each job
B x N x S x T feeds B random prompts of S tokens, each repeated N times (Tunix has no
grouped sampling), and asks for T new tokens, temperature 1 over the whole vocabulary
(Tunix's top-p mode at top_p = 1). The tokenizer is a stand-in that reads prompts as
space-separated ids: the timed call includes Tunix's own tokenize and detokenize, which it
always runs. An end-of-sequence id is set that a random-weight model practically never
draws (the realised mean length is reported), so every sample runs all T tokens.
Prints one JSON object (and writes it to --out): seconds per job, best of --repeats after
one warm-up call that compiles.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.models import dummy_model_creator
from tunix.models.llama3 import model as llama3

SMOLLM2_135M = dict(
    num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9, head_dim=64,
    num_kv_heads=3, rope_theta=100000, norm_eps=1e-5, weight_tying=True,
)  # fmt: skip
PAD, BOS, EOS = 0, 1, 49151


class IdTokenizer:
    """Prompts are space-separated token ids; ids print back the same way."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self) -> int:
        return BOS

    def eos_id(self) -> int:
        return EOS

    def pad_id(self) -> int:
        return PAD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="64x1x64x64,8x8x64x64", help="BxNxSxT, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    config = llama3.ModelConfig(**SMOLLM2_135M)
    model = dummy_model_creator.create_dummy_model(llama3.Llama3, config, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    result = {"tunix_jax": jax.__version__, "device": jax.devices()[0].device_kind, "jobs": []}
    for job in args.jobs.split(","):
        B, N, S, T = (int(x) for x in job.split("x"))
        cache = sampler_lib.CacheConfig(
            cache_size=S + T, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        )  # fmt: skip
        sampler = sampler_lib.Sampler(model, IdTokenizer(), cache)
        # S - 1 random ids (the sampler prepends BOS), none of them PAD, BOS or EOS.
        prompts = [" ".join(map(str, rng.integers(2, EOS, S - 1))) for _ in range(B)]
        strings = [p for p in prompts for _ in range(N)]

        def run(sampler=sampler, strings=strings, S=S, T=T):
            out = sampler(strings, max_generation_steps=T, max_prompt_length=S,
                          temperature=1.0, top_p=1.0, seed=0)  # fmt: skip
            return np.mean([len(t) for t in out.tokens])

        start = time.perf_counter()
        run()  # compiles
        compile_s = time.perf_counter() - start
        times, lengths = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            lengths.append(run())
            times.append(time.perf_counter() - start)
        row = {"B": B, "N": N, "S": S, "T": T, "seconds": min(times), "compile_s": compile_s,
               "mean_new_tokens": float(np.mean(lengths))}  # fmt: skip
        result["jobs"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
