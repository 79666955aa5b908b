"""The repository explains itself: every repository path that code, tests and docs cite
exists, every "docs/estimators.md section N" names a real section, and nothing cites the
team's private design notes, which are not in the repository."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ESTIMATORS = ROOT / "docs" / "estimators.md"
THIS = pathlib.Path(__file__).resolve()

# A cited path starts at one of the repository's top-level folders and is not the tail of
# a longer path or URL (hence the look-behind). Trailing punctuation is not part of it.
CITED_PATH = re.compile(
    r"(?<![\w./-])((?:docs|kjax|experiments|tests|bench|notebooks)/[\w./<>*{}-]*[\w>*}])"
)
# Placeholders, not paths: `kjax/tasks/<name>.py`, globs, `{a,b}`, and an all-caps name
# standing for any file (`experiments/results/NAME.md`, `experiments/configs/X.py`).
PLACEHOLDER = re.compile(r"[<>*{}]|/[A-Z][A-Z_]*(?:\.\w+)*(?:/|$)")
# "docs/estimators.md section 4", "... sections 1 and 3", "... s. 2, 4", across a line
# break (and a comment's `#`) too.
_NUMBERS = r"(\d+(?:\.\d+)?(?:(?:\s*,\s*|\s+and\s+|\s*-\s*)\d+(?:\.\d+)?)*)"
SECTION_REF = re.compile(
    re.escape("docs/estimators.md") + r"[\s#,:(]*(?:sections?|s\.|§)[\s#]*" + _NUMBERS
)
# Inside docs/estimators.md, a bare "section N" refers to the page itself.
SELF_SECTION_REF = re.compile(r"\bsections?\s+" + _NUMBERS)
# The private notes' file names and folder (docs/ holds the repository's own pages).
PRIVATE = re.compile(r"shared/design|(?<!docs/)\b(?:ESTIMATORS|ARCHITECTURE|STYLE|PERFORMANCE)\.md")


def _text_files(*suffixes: str) -> list[pathlib.Path]:
    files = [
        p
        for top in ("kjax", "experiments", "tests")
        for p in sorted((ROOT / top).rglob("*"))
        if p.suffix in suffixes and p.is_file() and "__pycache__" not in p.parts
    ]
    files += [ROOT / "README.md", ROOT / "BUILD.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in files if p.is_file()]


def _where(path: pathlib.Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


def _section_numbers(numbers: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", numbers)


def _headings() -> set[str]:
    """Section numbers of docs/estimators.md: "## 4. ..." gives "4", "### 2.5 ..." "2.5"."""
    text = ESTIMATORS.read_text()
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.?\s", text, flags=re.M))


def test_every_cited_repository_path_exists():
    missing = []
    for path in _text_files(".py"):
        text = path.read_text()
        for match in CITED_PATH.finditer(text):
            cited = match.group(1)
            if PLACEHOLDER.search(cited):
                continue
            if not (ROOT / cited).exists():
                missing.append(f"{_where(path, text, match.start())}: {cited}")
    assert not missing, "cited paths that do not exist in the repository:\n" + "\n".join(missing)


def test_estimators_sections_cited_exist():
    headings = _headings()
    assert {"1", "2", "3", "4"} <= headings, sorted(headings)
    bad = []
    refs = [(p, SECTION_REF) for p in _text_files(".py", ".md")]
    refs.append((ESTIMATORS, SELF_SECTION_REF))
    for path, pattern in refs:
        text = path.read_text()
        for match in pattern.finditer(text):
            for number in _section_numbers(match.group(1)):
                if number not in headings:
                    bad.append(f"{_where(path, text, match.start())}: section {number}")
    assert not bad, (
        'references to a section docs/estimators.md lacks (headings "## N." / "### N.M"):\n'
        + "\n".join(bad)
    )


def test_nothing_cites_the_private_design_notes():
    bad = []
    for path in _text_files(".py", ".md"):
        if path.resolve() == THIS:
            continue
        text = path.read_text()
        for match in PRIVATE.finditer(text):
            bad.append(f"{_where(path, text, match.start())}: {match.group(0)}")
    assert not bad, (
        "citations of notes outside the repository; cite docs/estimators.md (or "
        "docs/design.md) instead:\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ("see kjax/objectives/offpolicy.py.", ["kjax/objectives/offpolicy.py"]),
        ("presets in experiments/configs/ replace", ["experiments/configs"]),
        ("https://example.org/x/kjax/a.py", []),
        ("(docs/estimators.md section 4)", ["docs/estimators.md"]),
    ],
)
def test_path_pattern(text, cited):
    assert [m.group(1) for m in CITED_PATH.finditer(text)] == cited


@pytest.mark.parametrize(
    "cited",
    [
        "kjax/tasks/<name>.py",
        "experiments/results/NAME.md",
        "experiments/results/NAME.claims.json",
        "experiments/configs/X.py",
    ],
)
def test_placeholders_are_not_paths(cited):
    assert PLACEHOLDER.search(cited)
    assert not PLACEHOLDER.search("experiments/results/v1/tang2025_table.md")


def test_section_pattern_reads_every_number():
    text = "ESTIMATORS: docs/estimators.md\n    # sections 1 and 3; docs/estimators.md s. 2, 4"
    found = [n for m in SECTION_REF.finditer(text) for n in _section_numbers(m.group(1))]
    assert found == ["1", "3", "2", "4"]
