"""LiveBench: the builder on fixtures in the public question format, and the scorers on
hand-written answers (right, wrong, malformed) following LiveBench's published rules."""

import json
import pathlib

import pytest

from kjax.data import builders, loader
from kjax.data import livebench as lb_data
from kjax.inference import livebench

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "livebench"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("lb")
    source = loader.prepare(builders.Livebench, out, config="offline", manual_dir=FIXTURES)
    test = source.as_data_source()["test"]
    return {r["id"]: r for r in (loader.decode(test[i]) for i in range(len(test)))}


def test_builder_reads_math_and_reasoning_and_skips_other_categories(rows):
    assert sorted(rows) == sorted(
        [
            "amc-1",
            "aime-1",
            "amps-1",
            "amps-2",
            "wol-1",
            "zebra-1",
            "zebra-old",
            "spatial-1",
            "house-1",
        ]
    )
    assert rows["amps-2"]["ground_truth"] == "\\frac{5}{6}"  # a list: LiveBench scores the last
    assert rows["amc-1"]["subtask"] == "amc_12a_2024" and rows["wol-1"]["subtask"] == ""
    assert rows["zebra-old"]["release_date"] == "2024-06-24"
    assert rows["aime-1"]["question"].startswith("Find the remainder")
    assert all(livebench.is_scorable(r) for r in rows.values())


def test_builder_config_filters_categories(tmp_path):
    source = loader.prepare(lb_data.Livebench, tmp_path, config="math", manual_dir=FIXTURES)
    assert len(source.as_data_source()["test"]) == 4


def write(tmp_path, rows):
    d = tmp_path / "in" / "math" / "t"
    d.mkdir(parents=True)
    (d / "question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "in"


def test_builder_names_a_malformed_row_and_a_missing_directory(tmp_path):
    good = {
        "question_id": "a",
        "category": "math",
        "task": "t",
        "turns": ["q"],
        "ground_truth": "1",
        "livebench_release_date": "2024-11-25",
    }
    bad = dict(good, question_id="b", turns=[])
    manual = write(tmp_path, [good, bad])
    with pytest.raises(ValueError, match=r"question.jsonl:2: malformed row: field 'turns'"):
        loader.prepare(lb_data.Livebench, tmp_path / "out", config="math", manual_dir=manual)
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "README.txt").write_text("no questions here")
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        loader.prepare(lb_data.Livebench, tmp_path / "o2", manual_dir=tmp_path / "none")


def test_builder_rejects_duplicate_question_ids(tmp_path):
    row = {
        "question_id": 7,
        "category": "math",
        "task": "t",
        "turns": ["q"],
        "ground_truth": 3,
        "livebench_release_date": "2024-11-25",
    }
    manual = write(tmp_path, [row, row])
    with pytest.raises(ValueError, match="appears twice"):
        loader.prepare(lb_data.Livebench, tmp_path / "out", config="math", manual_dir=manual)


CASES = {
    "amc-1": [
        ("The answer is B. BBBBB", 1.0),
        ("<solution>B</solution>", 1.0),
        ("so $\\boxed{\\text{B}}$", 1.0),
        ("1 + 1 equals 2", 1.0),  # the option's value at the end counts
        ("I guess AAAAA", 0.0),
        ("<think>BBBBB</think> then AAAAA", 0.0),  # reasoning is dropped first
        ("", 0.0),
    ],
    "aime-1": [("2^10 = 1024, so the answer is 024", 1.0), ("the answer is 23", 0.0)],
    "amps-1": [
        ("So $\\boxed{x^2\\cos(x) + 2x\\sin(x)}$", 1.0),
        ("$\\boxed{2x\\cos(x)}$", 0.0),
        ("unfinished \\boxed{x^2", 0.0),
    ],
    "amps-2": [("The sum is $\\frac{5}{6}$", 1.0), ("$\\boxed{\\frac{2}{5}}$", 0.0)],
    "wol-1": [
        ("Hence **no, yes, unknown**", 1.0),
        ("<solution>no, yes, unknown</solution>", 1.0),
        ("farm: **no**; zoo: **yes**; cafe: **unknown**", 1.0),
        ("so: no, yes, unknown", 1.0),
        ("**yes, yes, unknown**", 0.0),
        ("I cannot tell.", 0.0),
    ],
    "zebra-1": [
        ("<solution>3, pizza, cat</solution>", 1.0),
        ("<solution>3, sushi, cat</solution>", (0 + 2 / 3) / 2),
        ("<solution>3</solution>", (0 + 1 / 3) / 2),
        ("Therefore:\n3, pizza, cat", 1.0),
        ("no idea", 0.0),
    ],
    "zebra-old": [("It is ***horror***.", 1.0), ("the genre is comedy", 0.0), ("horror", 1.0)],
    "spatial-1": [("**4**", 1.0), ("There are **four**", 1.0), ("**5**", 0.0), ("4", 0.0)],
    "house-1": [
        ("**kitchen**, then **hall**, then **attic**", 1.0),
        ("order: **kitchen, hall, attic**", 1.0),
        ("**attic, hall, kitchen**", 0.0),
        ("kitchen hall attic", 0.0),
    ],
}


@pytest.mark.parametrize("qid", sorted(CASES))
def test_scorers_on_fixture_answers(rows, qid):
    for answer, want in CASES[qid]:
        assert livebench.score(rows[qid], answer) == pytest.approx(want), answer


HOSTILE = [
    None,
    12345,
    ["B"],
    "**" * 5000,
    "<solution>" * 2000,
    "\\boxed{" * 3000,
    "{" * 10_000,
    "</solution></solution>" * 500,
    "\x00\ud800",
    "***" * 4000,
]


@pytest.mark.parametrize(
    "qid", ["amc-1", "aime-1", "wol-1", "zebra-1", "zebra-old", "spatial-1", "house-1"]
)
def test_malformed_answers_score_zero_without_raising(rows, qid):
    for answer in HOSTILE:
        assert livebench.score(rows[qid], answer) == 0.0


def test_data_errors_raise():
    row = {
        "id": "x",
        "task": "LCB_generation",
        "subtask": "",
        "question": "q",
        "ground_truth": "1",
        "release_date": "2024-11-25",
    }
    assert not livebench.is_scorable(row)
    with pytest.raises(ValueError, match="no offline scorer"):
        livebench.score(row, "anything")
    amc = dict(row, task="math_comp", subtask="amc_12b_2024", ground_truth="7")
    with pytest.raises(ValueError, match="one letter A-E"):
        livebench.score(amc, "BBBBB")
