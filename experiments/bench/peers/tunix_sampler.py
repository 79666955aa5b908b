"""Tunix's side of `experiments.bench.bench_sampler --tunix_python=...`: its Sampler, timed.

  /tmp/tunixenv/bin/python experiments/bench/peers/tunix_sampler.py \
      --config='{"num_layers": 30, ...}' --jobs=64x1x64x64,8x8x64x64 --out=t.json

Run by a separate environment's python holding google-tunix (and the jax/flax it pins;
never kjax): `python3 -m venv /tmp/tunixenv && /tmp/tunixenv/bin/pip install google-tunix`.
The model is Tunix's own Llama3 (`tunix.models.llama3.model.Llama3`) with random weights
(`create_dummy_model`), float32, at the shape --config gives as Tunix ModelConfig fields
(bench_sampler derives them from the kjax LlamaConfig it times, so both sides share one). Each job
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

PAD, BOS = 0, 1


class IdTokenizer:
    """Prompts are space-separated token ids; ids print back the same way."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self) -> int:
        return BOS

    def __init__(self, eos: int):
        self.eos = eos

    def eos_id(self) -> int:
        return self.eos

    def pad_id(self) -> int:
        return PAD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="Tunix Llama3 ModelConfig fields, JSON")
    parser.add_argument("--jobs", default="64x1x64x64,8x8x64x64", help="BxNxSxT, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    config = llama3.ModelConfig(**json.loads(args.config))
    eos = config.vocab_size - 1
    model = dummy_model_creator.create_dummy_model(llama3.Llama3, config, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    result = {"tunix_jax": jax.__version__, "device": jax.devices()[0].device_kind, "jobs": []}
    for job in args.jobs.split(","):
        B, N, S, T = (int(x) for x in job.split("x"))
        cache = sampler_lib.CacheConfig(
            cache_size=S + T, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        )  # fmt: skip
        sampler = sampler_lib.Sampler(model, IdTokenizer(eos), cache)
        # S - 1 random ids (the sampler prepends BOS), none of them PAD, BOS or EOS.
        prompts = [" ".join(map(str, rng.integers(2, eos, S - 1))) for _ in range(B)]
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
