"""benchmarks/results/ holds the records the project cites, and only those.

A record is cited when its file name (or a `{a,b}` brace form, or a `*` glob, naming it) appears
in a text file of the tree: README, CHANGELOG, docs/, the NOTES and docstrings beside the code,
benchmark configs. Companions share a cited record's stem (`X.json` cited keeps `X.png`). Every
record name a Markdown page cites must exist, so a page never points at a record that left.
Superseded records leave the tree; git keeps them.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CITING_ROOTS = ("docs", "benchmarks", "vllm_treespec", "kernels", "configs", "csrc", "tests", "scripts", "demo", ".ci")
CITING_TOP = ("README.md", "CHANGELOG.md", "Makefile", "setup.py", "pyproject.toml")
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".h", ".hpp", ".cpp", ".cu", ".cuh", ".sh", ".toml", ".txt"}
SKIP_DIRS = {"__pycache__", "build", "results", ".venv"}
RECORD_NAME = re.compile(r"[A-Za-z0-9_./{},*+-]+\.(?:json|png|md|csv|log|txt)\b")


def expand_braces(name: str) -> list[str]:
    """`a{1,2}b{,_x}` -> a1b, a1b_x, a2b, a2b_x (shell brace expansion, innermost pair first)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if m is None:
        return [name]
    out: list[str] = []
    for alt in m.group(1).split(","):
        out += expand_braces(name[:m.start()] + alt + name[m.end():])
    return out


def citing_files() -> list[Path]:
    files = [REPO / f for f in CITING_TOP if (REPO / f).exists()]
    for root in CITING_ROOTS:
        for p in sorted((REPO / root).rglob("*")):
            rel = p.relative_to(REPO).parts
            if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
                continue
            if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile"):
                files.append(p)
    return files


def citations() -> dict[str, set[Path]]:
    """Every record-like name in the citing files (braces expanded) -> the files naming it."""
    refs: dict[str, set[Path]] = {}
    for path in citing_files():
        for token in RECORD_NAME.findall(path.read_text(errors="replace")):
            for name in expand_braces(token):
                refs.setdefault(name, set()).add(path)
    return refs


def test_brace_expansion() -> None:
    assert expand_braces("a_c{1,8}_{x,y}.json") == ["a_c1_x.json", "a_c1_y.json", "a_c8_x.json", "a_c8_y.json"]
    assert expand_braces("r{,_run2}.json") == ["r.json", "r_run2.json"]
    assert expand_braces("plain.json") == ["plain.json"]


@pytest.fixture(scope="module")
def refs() -> dict[str, set[Path]]:
    return citations()


def test_every_kept_record_is_cited(refs: dict[str, set[Path]]) -> None:
    records = sorted(p.name for p in RESULTS.iterdir() if p.is_file())
    names = {n.rsplit("/", 1)[-1] for n in refs}
    globs = [n for n in names if "*" in n]
    cited_stems = {Path(r).stem for r in records
                   if r in names or any(fnmatch.fnmatch(r, g) for g in globs)}
    uncited = [r for r in records if Path(r).stem not in cited_stems]
    assert not uncited, (f"{len(uncited)} record(s) in benchmarks/results/ that no doc, note or docstring "
                         f"cites; cite each where its figure is used or `git rm` it: {uncited[:20]}")


def test_every_record_a_page_cites_exists(refs: dict[str, set[Path]]) -> None:
    records = {p.name for p in RESULTS.iterdir() if p.is_file()}
    families = {r.split("_")[0] + "_" for r in records}
    missing = []
    for name, paths in refs.items():
        pages = sorted(str(p.relative_to(REPO)) for p in paths if p.suffix == ".md")
        directory, _, base = name.rpartition("/")
        if not pages or "*" in base or not base.startswith(tuple(families)):
            continue
        if directory and not directory.endswith("results"):
            continue        # a path elsewhere (/tmp/..., an output a command writes)
        if base not in records:
            missing.append((base, pages))
    assert not missing, f"pages cite records that benchmarks/results/ does not hold: {sorted(missing)[:20]}"
