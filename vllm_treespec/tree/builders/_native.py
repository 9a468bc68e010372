"""Dispatch to the C++ builders (`_C.tree_beam_search`, `_C.tree_best_first`).

The C++ path runs for a DepthTable with a built-in (linear) scorer whose n-gram signal, if any,
has a C++ twin (`_C.NgramScorer`, or an object with ``native()`` such as `NgramTable` or the n-gram
trie drafter's `TrieSignal`).
``backend="auto"`` picks C++ when possible, ``"python"`` forces the reference, ``"cpp"`` raises
if C++ cannot run (and says why).
"""
from __future__ import annotations


from vllm_treespec.tree.builders._common import BuildError, Scoring
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree

BACKENDS = ("auto", "python", "cpp")
_C_MODULE = None


def _module():
    global _C_MODULE
    if _C_MODULE is None:
        from vllm_treespec.native import native

        _C_MODULE = native()
    return _C_MODULE


def _native_ngram(rho):
    if rho is None:
        return None
    try:
        C = _module()
    except ImportError:
        return None
    if isinstance(rho, C.NgramScorer):
        return rho
    if hasattr(rho, "native"):
        nat = rho.native()
        return nat if isinstance(nat, C.NgramScorer) else None
    return None


def use_cpp(builder: str, backend: str, cand, scoring: Scoring, depth: int) -> bool:
    if backend not in BACKENDS:
        raise BuildError(f"builder {builder!r}: parameter 'backend' must be one of {BACKENDS}, "
                         f"got {backend!r}")
    if backend == "python":
        return False
    reason = None
    if not isinstance(cand, DepthTable):
        reason = "the candidates are an Expander (C++ takes a DepthTable)"
    elif not scoring.linear:
        reason = f"scorer {scoring.scorer!r} is not a built-in linear scorer"
    else:
        needs_ngram = any(b != 0.0 for b in scoring.coeffs()[1][:depth])
        if needs_ngram and _native_ngram(scoring.rho) is None:
            reason = "the n-gram signal rho has no C++ twin (_C.NgramScorer or .native())"
        else:
            try:
                _module()
            except ImportError as e:
                reason = f"the C++ extension does not load ({e})"
    if reason is None:
        return True
    if backend == "cpp":
        raise BuildError(f"builder {builder!r}: backend='cpp' is not available: {reason}")
    return False


def table_args(table: DepthTable, scoring: Scoring, depth: int, topk: list[int]) -> dict:
    a, b, c = (x[:depth] for x in scoring.coeffs())
    eps = scoring.scorer.eps
    return dict(
        tokens=table.tokens[:depth], logq=table.logprobs[:depth], topk=topk, a=a, b=b, c=c,
        smooth=eps is not None, eps=float(eps or 0.0), context=scoring.base_ctx,
        ngram=_native_ngram(scoring.rho) if any(x != 0.0 for x in b) else None)


def tree_from_native(result) -> DraftTree:
    return DraftTree(*result, validate=False)


def beam_cpp(table, scoring, depth, topk, width, budget, early_stop) -> DraftTree:
    args = table_args(table, scoring, depth, topk)
    return tree_from_native(_module().tree_beam_search(
        **args, root=table.root, width=width, budget=budget, early_stop=early_stop))


def best_first_cpp(table, scoring, depth, topk, budget, greedy_spine) -> DraftTree:
    args = table_args(table, scoring, depth, topk)
    return tree_from_native(_module().tree_best_first(
        **args, root=table.root, budget=budget, greedy_spine=greedy_spine))
