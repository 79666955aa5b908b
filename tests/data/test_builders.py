"""TFDS builders prepared offline as array_record, read back through data sources."""

import shutil
import socket
from pathlib import Path

import pytest

from kjax.data import builders, loader, synthetic

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


def test_arith_builder_schema_and_determinism(data_dir):
    config = builders.ArithConfig(name="tiny", train_size=40, test_size=10, seed=5)
    b = loader.prepare(builders.KjaxArith, data_dir, config=config)
    source = b.as_data_source()
    assert (len(source["train"]), len(source["test"])) == (40, 10)
    rows = [loader.decode(source["train"][i]) for i in range(len(source["train"]))]
    assert all(
        set(r) == {"id", "question", "answer"} and isinstance(r["answer"], int) for r in rows
    )
    # The stored rows are exactly the generator's (order aside), so the seed fixes them.
    expected = list(synthetic.arith_problems(config.spec, synthetic.Split.TRAIN, 5, 40))
    assert sorted(rows, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])
    files = [p.name for p in Path(b.data_path).iterdir()]
    assert any("array_record" in f for f in files)


def test_countdown_builder_schema(data_dir):
    config = builders.CountdownConfig(name="tiny", train_size=10, test_size=5)
    source = loader.prepare(builders.KjaxCountdown, data_dir, config=config).as_data_source()
    row = loader.decode(source["test"][0])
    assert set(row) == {"id", "numbers", "target", "solution"}
    assert len(row["numbers"]) == 4 and all(isinstance(n, int) for n in row["numbers"])
    from kjax.rewards import countdown

    solution = countdown.parse(row["solution"])  # the stored solution reaches the target
    assert solution.value == row["target"] and sorted(solution.numbers) == row["numbers"]


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        ("math", "train", {"\\frac{3}{4}", "4"}),
        ("math", "test", {"3"}),
        ("gsm8k", "test", {"7", "750"}),
        ("harp", "test", {"8", "\\frac{5}{2}"}),
    ],
)
def test_math_jsonl_formats(data_dir, name, split, expected):
    b = loader.prepare(builders.MathJsonl, data_dir, config=name, manual_dir=FIXTURES)
    rows = [loader.decode(r) for r in b.as_data_source()[split]]
    assert {r["answer"] for r in rows} == expected
    assert all(r["source"] == name and r["problem"] for r in rows)


def test_code_jsonl_formats(data_dir):
    cc = loader.prepare(builders.CodeJsonl, data_dir, config="code_contests", manual_dir=FIXTURES)
    rows = {r["id"]: r for r in map(loader.decode, cc.as_data_source()["test"])}
    assert rows["1_A. Sum"]["inputs"] == ["1 2\n", "5 7\n"]  # public then private tests
    assert rows["1_A. Sum"]["outputs"] == ["3\n", "12\n"]
    assert rows["2_B. Echo"]["inputs"] == ["hi\n", "x y\n"]
    taco = loader.prepare(builders.CodeJsonl, data_dir, config="taco", manual_dir=FIXTURES)
    rows = [loader.decode(r) for r in taco.as_data_source()["train"]]
    assert len(rows) == 1 and rows[0]["outputs"] == ["9\n", "-1\n"]  # call-based one skipped


def test_humaneval_from_the_package(data_dir):
    source = loader.prepare(builders.Humaneval, data_dir).as_data_source()["test"]
    assert len(source) == 164
    row = loader.decode(source[0])
    assert row["id"].startswith("HumanEval/") and "def check(candidate)" in row["test"]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "malformed row"),
        ('{"question": "q", "answer": "no marker"}', "####"),
        ('["a list"]', "JSON object"),
        ('{"question": "q"}', "missing field 'answer'"),
    ],
)
def test_malformed_row_names_file_and_line_and_leaves_nothing(tmp_path, bad_line, message):
    manual = tmp_path / "manual"
    shutil.copytree(FIXTURES / "gsm8k", manual / "gsm8k")
    with open(manual / "gsm8k" / "test.jsonl", "a") as f:
        f.write(bad_line + "\n")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=rf"test\.jsonl:3: .*{message}"):
        loader.prepare(builders.MathJsonl, out, config="gsm8k", manual_dir=manual)
    left = [p.name for p in (out / "math_jsonl" / "gsm8k").iterdir()]
    assert left == [], f"half-written dataset left behind: {left}"


def test_missing_manual_files_name_the_expected_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"harp/test\.jsonl"):
        loader.prepare(builders.MathJsonl, tmp_path / "out", config="harp", manual_dir=tmp_path)


def test_preparation_needs_no_network(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("dataset preparation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    loader.prepare(builders.Humaneval, tmp_path)
    loader.prepare(builders.CodeJsonl, tmp_path, config="taco", manual_dir=FIXTURES)
    config = builders.ArithConfig(name="offline", train_size=5, test_size=5)
    assert (
        len(loader.prepare(builders.KjaxArith, tmp_path, config=config).as_data_source()["test"])
        == 5
    )
