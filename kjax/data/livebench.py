"""LiveBench questions from a local copy of the public release (no download).

Reads every `question.jsonl` under manual_dir (LiveBench's layout is
<category>/<task>/question.jsonl; any *.jsonl is read) into one "test" split. Fields
used: question_id, category, task, subtask (optional), turns (turns[0] is the question),
ground_truth, livebench_release_date, livebench_removal_date (optional, "" = active).
Scoring: kjax.inference.livebench.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow_datasets as tfds

from kjax.data import formats

FEATURES = ("id", "category", "task", "subtask", "question", "ground_truth", "release_date")
FEATURES += ("removal_date",)


@dataclasses.dataclass(eq=False)
class LivebenchConfig(tfds.core.BuilderConfig):
    categories: tuple[str, ...] = ("math", "reasoning")  # the offline-checkable ones


def parse_question(row: dict, index: int) -> dict | None:
    """One LiveBench question row -> kjax's schema (None for other categories' rows is
    decided by the caller); raises formats.RowError naming the bad field."""
    qid = row.get("question_id")
    if not isinstance(qid, str | int) or isinstance(qid, bool) or qid == "":
        raise formats.RowError("missing or empty field 'question_id'")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise formats.RowError("field 'turns' must be a non-empty list of strings")
    truth = row.get("ground_truth")
    if isinstance(truth, list) and truth:  # some AMPS_Hard rows: LiveBench scores the last
        truth = truth[-1]
    if isinstance(truth, int | float) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str) or not truth.strip():
        raise formats.RowError("field 'ground_truth' must be a non-empty string")
    subtask = row.get("subtask") or ""
    removal = row.get("livebench_removal_date") or ""
    if not isinstance(subtask, str) or not isinstance(removal, str):
        raise formats.RowError("fields 'subtask' and 'livebench_removal_date' must be strings")
    return {
        "id": str(qid),
        "category": formats._field(row, "category"),
        "task": formats._field(row, "task"),
        "subtask": subtask,
        "question": turns[0],
        "ground_truth": truth,
        "release_date": formats._field(row, "livebench_release_date"),
        "removal_date": removal,
    }


def question_files(manual_dir) -> list[Path]:
    if manual_dir is None:
        raise ValueError("livebench: no manual_dir given; pass manual_dir= to loader.prepare.")
    files = sorted(Path(manual_dir).rglob("*.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"livebench: no *.jsonl under {manual_dir}; put LiveBench's question release "
            "there (<category>/<task>/question.jsonl, e.g. from `python download_questions.py` "
            "in the LiveBench repository or the livebench/* datasets on Hugging Face)."
        )
    return files


class Livebench(tfds.core.GeneratorBasedBuilder):
    """LiveBench questions of the configured categories from <manual_dir>/**/*.jsonl."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        LivebenchConfig(name="offline"),
        LivebenchConfig(name="math", categories=("math",)),
        LivebenchConfig(name="reasoning", categories=("reasoning",)),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Place LiveBench's question.jsonl files under manual_dir."

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({n: tfds.features.Text() for n in FEATURES})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"test": self._generate_examples(question_files(dl_manager.manual_dir))}

    def _generate_examples(self, files):
        wanted, seen = set(self.builder_config.categories), set()
        for path in files:

            def parse(row, line_no):
                if row.get("category") not in wanted:
                    return None  # checked first: other categories need no ground truth
                return parse_question(row, line_no)

            for example in formats.read_jsonl(path, parse):
                if example["id"] in seen:
                    raise ValueError(f"{path}: question_id {example['id']!r} appears twice.")
                seen.add(example["id"])
                yield example["id"], example
