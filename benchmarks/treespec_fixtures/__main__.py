"""`PYTHONPATH=benchmarks python -m treespec_fixtures NAME [--tokenizer DIR]`: build or reuse
fixture NAME and print its path last: a model or head fixture's directory, or a trie fixture's
file (built for --tokenizer's tokenizer; default: the code-lm fixture's, whose tokenizer the
self-distilled tries need)."""
from __future__ import annotations

import argparse
import sys

from treespec_fixtures.registry import FIXTURES, build_fixture
from treespec_fixtures.tries import build_trie_fixture, trie_fixture_names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m treespec_fixtures",
                                description="build or reuse a lab fixture; prints its path last")
    p.add_argument("name", choices=sorted([*FIXTURES, *trie_fixture_names()]))
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="trie fixtures: the tokenizer directory to build for (default: the code-lm fixture's)")
    ns = p.parse_args(argv)
    if ns.name in FIXTURES:
        print(build_fixture(ns.name))
    else:
        print(build_trie_fixture(ns.name, ns.tokenizer or build_fixture("code-lm"), progress=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
