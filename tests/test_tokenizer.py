"""kjax.tokenizer on a tiny word-level tokenizer: chat template, left padding, mask."""

import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer as RawTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from kjax import tokenizer

WORDS = ["<pad>", "<eos>", "<user>", "<bot>", "hi", "there", "how", "are", "you"]
TEMPLATE = (
    "{% for m in messages %}{{ '<user> ' if m['role'] == 'user' else '<bot> ' }}"
    "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    raw = RawTokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    raw.pre_tokenizer = Whitespace()
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", chat_template=TEMPLATE
    )
    hf.add_special_tokens({"additional_special_tokens": ["<user>", "<bot>"]})
    path = tmp_path_factory.mktemp("tok")
    hf.save_pretrained(str(path))
    return tokenizer.load(str(path))


def test_chat_batch_is_left_padded_with_mask(tok):
    tokens, mask = tok.chat_batch(
        [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "how are you"}]]
    )
    ids = {w: i for i, w in enumerate(WORDS)}
    expected_long = [ids["<user>"], ids["how"], ids["are"], ids["you"], ids["<bot>"]]
    np.testing.assert_array_equal(tokens[1], expected_long)
    np.testing.assert_array_equal(tokens[0], [0, 0, ids["<user>"], ids["hi"], ids["<bot>"]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert tokens.dtype == np.int32 and mask.dtype == bool
    assert tok.decode(tokens[1, 1:4]) == "how are you"


def test_pad_left_fixed_length_and_overflow(tok):
    tokens, mask = tok.pad_left([[4, 5], []], length=3)
    np.testing.assert_array_equal(tokens, [[0, 4, 5], [0, 0, 0]])
    np.testing.assert_array_equal(mask, [[0, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="does not fit length=1"):
        tok.pad_left([[4, 5]], length=1)


def test_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        tokenizer.load(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        tokenizer.load(str(tmp_path / "nope.gguf"))
