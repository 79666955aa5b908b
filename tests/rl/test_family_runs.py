"""A 2-step RL run of a random-weight tiny Qwen3, Qwen2 and Mistral, each loaded with
ModelConfig(kind=HF_DIR) from a transformers directory (the family comes from its
config.json), sampled and trained on the fake 8-device mesh with fsdp=2 x tensor=2."""

import json

import numpy as np
import pytest
import transformers
from tokenizers import Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer
from tokenizers.models import WordLevel

from kjax.models import Family, load
from kjax.rl.config import (
    ArithConfig,
    EvalConfig,
    MeshConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    Operator,
    OptimizerConfig,
    SFTConfig,
    StepConfig,
    TrainConfig,
)
from kjax.rl.loop import train_and_evaluate
from tests.models.hf_reference import random_family_model

SPECIALS = ["<pad>", "<eos>", "<user>", "<bot>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
TEMPLATE = (
    "{% for m in messages %}<user>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<bot>{% endif %}"
)
FAMILIES = {  # model_type -> features on: window 6 < prompt + completion on some layers
    "qwen3": dict(head_dim=8, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "qwen2": dict(use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "mistral": dict(sliding_window=6),
}


def _char_tokenizer():
    """A character-level transformers tokenizer with a chat template (no hub)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    raw = RawTokenizer(WordLevel(vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", chat_template=TEMPLATE
    )
    hf.add_special_tokens({"additional_special_tokens": ["<user>", "<bot>"]})
    return hf


@pytest.mark.parametrize(
    "family",
    # Qwen3 (q/k norms and a window) and Mistral (a window on every layer) in the default
    # tier; Qwen2 (biases; ~16 s, its logits are checked against transformers in
    # tests/models) in the slow tier, for the default tier's 15-minute budget.
    [
        "qwen3",
        pytest.param("qwen2", marks=pytest.mark.slow),
        pytest.param("mistral", marks=pytest.mark.slow),  # ~22 s; its logits: tests/models
    ],
)
def test_two_sharded_rl_steps_of_a_family_loaded_from_its_hf_dir(tmp_path, family):
    tokenizer = _char_tokenizer()
    model = random_family_model(
        family,
        seed=5,
        std=0.05,
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=256,
    )
    model.save_pretrained(str(tmp_path / "model"))
    tokenizer.save_pretrained(str(tmp_path / "model"))
    assert load(str(tmp_path / "model")).config.family is Family(family)  # from config.json
    cfg = TrainConfig(
        name=f"{family}_smoke",
        steps=2,
        batch_prompts=4,
        samples=2,
        max_new_tokens=6,
        objective=ObjectiveConfig(Objective.MAX_AT_K, k=2),
        rl=StepConfig(microbatches=1, entropy_coef=0.1),  # a gradient even at reward 0
        optimizer=OptimizerConfig(learning_rate=1e-2, total_steps=2),
        model=ModelConfig(kind=ModelKind.HF_DIR, path=str(tmp_path / "model")),
        task=ArithConfig(
            digits=1, operands=2, operators=(Operator.ADD,), train_size=16, test_size=4
        ),
        sft=SFTConfig(steps=0),
        eval=EvalConfig(every=100, n_eval=2, problems=4),
        mesh=MeshConfig(data=2, fsdp=2, tensor=2),
    )
    train_and_evaluate(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2] and all(r["finite"] for r in steps)
    assert np.isfinite(steps[-1]["entropy"]) and steps[-1]["entropy"] > 0
