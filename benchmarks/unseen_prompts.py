"""Unseen code prompts: function heads (signature + docstring) from third-party packages.

The code-LM fixtures (and the tries distilled from them) were trained on the Python standard
library (`vllm_treespec.train.corpus`), so prompts cut from stdlib files, even held-out ones,
share its idioms. These prompts come from the third-party packages installed in the running
interpreter's site-packages instead (jinja2, pydantic, requests, ... whatever is present): each
one is a function's `def` line(s) and docstring, dedented, ending after the docstring, so the
natural continuation is a function body the model has never seen.

Deterministic for a seed and the installed package versions: packages are taken in a seeded
order, round robin; within a package a seeded pick of a file from its sorted file walk, the
AST function nodes of that file that have a docstring, and a seeded pick among them. Never a
stdlib file: only files under site-packages, no top-level name of the stdlib, no vendored copies
(`_vendor`, `_distutils`, ...), no known stdlib backports, and no head whose docstring's first
line occurs verbatim in the stdlib sources the fixtures were trained on.

    .venv/bin/python benchmarks/unseen_prompts.py                    # summary: packages, versions, hash
    .venv/bin/python benchmarks/unseen_prompts.py --list --num 8     # print the prompts
    .venv/bin/python benchmarks/unseen_prompts.py --list --packages jinja2 click --seed 3
"""
from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import random
import sys
import sysconfig
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

# Widely used pure-Python libraries; the ones installed are used (--packages overrides).
DEFAULT_PACKAGES = (
    "aiohttp", "attr", "click", "dateutil", "fastapi", "flask", "httpx", "huggingface_hub",
    "jinja2", "jsonschema", "markdown_it", "networkx", "packaging", "pydantic", "pygments",
    "requests", "rich", "starlette", "sympy", "tqdm", "transformers", "urllib3", "werkzeug", "yaml",
)
# Packages that are (partly) copies of stdlib modules, and directories holding vendored copies.
STDLIB_BACKPORTS = frozenset({
    "backports", "typing_extensions", "importlib_metadata", "importlib_resources", "zipp", "tomli",
    "exceptiongroup", "dataclasses", "enum34", "pathlib2", "contextlib2", "singledispatch",
    "futures", "concurrent", "_distutils_hack", "distutils", "setuptools", "pkg_resources", "pip",
})
SKIP_DIRS = frozenset({"_vendor", "vendor", "vendored", "_distutils", "__pycache__", "tests", "test",
                       "testing", "examples"})
MIN_CHARS = 150
MAX_CHARS = 900
_MIN_DOC_LINE = 24      # a docstring first line at least this long is checked against the stdlib


@dataclass(frozen=True)
class Prompt:
    package: str
    path: str           # relative to site-packages
    lineno: int
    name: str
    text: str


def site_packages_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()})


def stdlib_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["stdlib"]).resolve(), Path(paths["platstdlib"]).resolve()})


def is_stdlib_path(path: Path) -> bool:
    """True for a file of the Python standard library (under the stdlib directories and not
    under a site-packages directory, which a venv's platstdlib contains)."""
    p = Path(path).resolve()
    if any(p.is_relative_to(s) for s in site_packages_dirs()):
        return False
    return any(p.is_relative_to(s) for s in stdlib_dirs())


def package_root(name: str) -> Path:
    """The directory (or single module file) of top-level package `name` in site-packages.
    ValueError for a stdlib name, a stdlib backport or a name not installed there."""
    if name in sys.stdlib_module_names or name in STDLIB_BACKPORTS:
        raise ValueError(f"{name!r} is a stdlib module or a copy of one; unseen prompts need third-party code")
    for sp in site_packages_dirs():
        for candidate in (sp / name, sp / f"{name}.py"):
            if candidate.exists() and not is_stdlib_path(candidate):
                return candidate
    where = ", ".join(map(str, site_packages_dirs()))
    raise ValueError(f"package {name!r} is not installed in site-packages ({where})")


def installed(packages: tuple[str, ...] | list[str] = DEFAULT_PACKAGES) -> list[str]:
    """The names of `packages` that package_root finds, sorted."""
    out = []
    for name in packages:
        try:
            package_root(name)
        except ValueError:
            continue
        out.append(name)
    return sorted(out)


def package_files(name: str) -> list[Path]:
    """The package's .py files in a stable (sorted) order, vendored and test directories skipped."""
    root = package_root(name)
    if root.is_file():
        return [root]
    files = [p for p in root.rglob("*.py")
             if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]) and not is_stdlib_path(p)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def function_heads(source: str, min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS
                   ) -> list[tuple[int, str, str]]:
    """(line, name, head) of every function with a docstring and a body after it whose head
    (def line(s) + docstring, dedented, ending in a newline) is ASCII and min..max chars long."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        if len(node.body) < 2:      # docstring only (an abstract stub): nothing to continue with
            continue
        doc = node.body[0]
        head = textwrap.dedent("\n".join(lines[node.lineno - 1:doc.end_lineno])) + "\n"
        if min_chars <= len(head) <= max_chars and head.isascii() and head.lstrip().startswith(("def ", "async def ")):
            out.append((node.lineno, node.name, head))
    return sorted(out)


@functools.lru_cache(maxsize=1)
def _stdlib_text() -> str:
    from vllm_treespec.train.corpus import read_text, stdlib_files

    return "\n".join(read_text(p) for p in stdlib_files())


def copied_from_stdlib(head: str, docstring_first_line: str | None = None) -> bool:
    """True when the head's docstring's first line (when long enough to be telling) occurs
    verbatim in the stdlib sources the fixtures train on."""
    line = docstring_first_line
    if line is None:
        node = ast.parse(head + "    pass\n").body[0]
        line = (ast.get_docstring(node, clean=False) or "").strip().splitlines()[0:1]
        line = line[0].strip() if line else ""
    return len(line) >= _MIN_DOC_LINE and line in _stdlib_text()


def build_prompts(num: int, seed: int = 0, packages: tuple[str, ...] | list[str] | None = None,
                  min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS) -> list[Prompt]:
    """`num` distinct function-head prompts, packages round robin in a seeded order."""
    if packages is None:
        names = installed(DEFAULT_PACKAGES)
    else:
        names = sorted(set(packages))
        for name in names:
            package_root(name)      # a named package that is missing or stdlib: ValueError
    if not names:
        raise ValueError("none of the candidate packages is installed in site-packages")
    rng = random.Random(seed)
    order = list(names)
    rng.shuffle(order)
    files = {n: package_files(n) for n in order}
    sp_roots = site_packages_dirs()
    parsed: dict[Path, list[tuple[int, str, str]]] = {}
    seen_texts: set[str] = set()
    live = [n for n in order if files[n]]
    out: list[Prompt] = []
    i = 0
    while len(out) < num:
        if not live:
            raise ValueError(f"only {len(out)} distinct function heads found in {names}; asked for {num}")
        name = live[i % len(live)]
        prompt = None
        for _ in range(50):             # files without a usable head are common (__init__.py ...)
            path = files[name][rng.randrange(len(files[name]))]
            if path not in parsed:
                try:
                    source = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    source = ""
                parsed[path] = function_heads(source, min_chars, max_chars)
            heads = [h for h in parsed[path] if h[2] not in seen_texts]
            if not heads:
                continue
            lineno, fname, text = heads[rng.randrange(len(heads))]
            seen_texts.add(text)
            if copied_from_stdlib(text):
                continue
            rel = next((path.relative_to(s) for s in sp_roots if path.is_relative_to(s)), path)
            prompt = Prompt(name, rel.as_posix(), lineno, fname, text)
            break
        if prompt is None:              # this package seems exhausted: drop it
            live.remove(name)
            continue
        out.append(prompt)
        i += 1
    return out


def prompts_sha256(texts: list[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()


def package_versions(names: list[str]) -> dict[str, str | None]:
    """Top-level package name -> version of the distribution that provides it."""
    from importlib import metadata

    dists = metadata.packages_distributions()
    out = {}
    for name in sorted(set(names)):
        version = None
        for dist in dists.get(name, []):
            try:
                version = f"{dist} {metadata.version(dist)}"
                break
            except metadata.PackageNotFoundError:
                continue
        out[name] = version
    return out


def describe(prompts: list[Prompt], seed: int) -> dict:
    """What a results record keeps about a prompt list."""
    names = sorted({p.package for p in prompts})
    return {"source": "benchmarks/unseen_prompts.py (function heads of third-party packages)",
            "seed": seed, "count": len(prompts), "packages": package_versions(names),
            "sha256": prompts_sha256([p.text for p in prompts]),
            "chars_mean": round(sum(len(p.text) for p in prompts) / max(len(prompts), 1), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packages", nargs="+", default=None,
                   help=f"top-level package names (default: those installed of {' '.join(DEFAULT_PACKAGES)})")
    p.add_argument("--list", action="store_true", help="print every prompt")
    p.add_argument("--json", action="store_true", help="print the prompts as JSON")
    ns = p.parse_args(argv)
    try:
        prompts = build_prompts(ns.num, ns.seed, ns.packages)
    except ValueError as e:
        p.error(str(e))
    if ns.json:
        print(json.dumps([asdict(x) for x in prompts], indent=1))
        return 0
    if ns.list:
        for i, x in enumerate(prompts):
            print(f"# [{i}] {x.path}:{x.lineno} {x.name}\n{x.text}")
    print(json.dumps(describe(prompts, ns.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
