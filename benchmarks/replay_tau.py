"""Acceptance replay: tau of any drafter config against the target's recorded greedy outputs.

Greedy tree verification accepts exactly the longest tree path that spells the target's own
greedy continuation, so with the target's greedy outputs recorded once (vLLM, no speculation,
cached under the fixture cache keyed by model, prompts and max_tokens), each config's tau is
replayed without a model forward: draft from prompt + output[:t], walk the tree along
output[t:], commit the accepted path plus the bonus token, repeat. Minutes of serving runs
become seconds, which is what tuning tree shape and scoring needs. The replay equals the
serving run at concurrency 1 up to the scheduler's cuts near max_model_len (none here);
`bench_serving.py` remains the measurement of record for tokens/s.

    .venv/bin/python benchmarks/replay_tau.py                       # chains vs trees, budgets 8/16/32/64
    .venv/bin/python benchmarks/replay_tau.py --budgets 16 --configs demo/ngram-trie demo/ngram-trie-tree
    .venv/bin/python benchmarks/replay_tau.py --config-json '{"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "beam"}}'

On unseen prompts (benchmarks/unseen_prompts.py, what bench_matrix serves), beside vLLM's `suffix`
method replayed through arctic_inference's SuffixDecodingCache with vLLM 0.32's defaults (needs
benchmarks/install_suffix.sh; the request's response is added to its cache as it grows and
joins the global tree when the request finishes, as vLLM's proposer does):

    .venv/bin/python benchmarks/replay_tau.py --prompts unseen --num-prompts 64 --budgets 24 \
        --configs lookup-online suffix

`--configs ngram` replays vLLM's `ngram` the same way (its own match function, n-gram range 1-4
as the benchmarks serve it, `--budgets` tokens after the match).

tau here = 1 + accepted / steps-with-a-draft (the serving benchmark's definition); also printed:
tokens per step over all steps, and drafting time per step (drafter + builder, one thread). The
record also keeps, per config, the share of steps with a draft and, per bin of the drafter's own
rating of a node (its path probability), how many nodes were drafted there and the share accepted:
what budget.gain.confidence calibrates (`--ratings` prints it).

Drafters that read the target's hidden states (DART heads) get them from one Hugging Face forward
over prompt + output per request (the same weights; vLLM's aux id j = HF hidden_states[j]), and
each step hands over the rows committed since the previous one, as the engine does:

    .venv/bin/python benchmarks/replay_tau.py --budgets 16 --configs dart dart-chain dart-best-first
    .venv/bin/python benchmarks/replay_tau.py --budgets 16 32 --configs jetspec-chain jetspec-best-first \
        jetspec-best-first-presto jetspec-beam-presto diffusion-chain diffusion-best-first \
        diffusion-best-first-presto diffusion-beam-presto
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/replay_tau.py --budgets 16 --num-prompts 4 \
        --configs jetspec-best-first --profile 18                   # where a head drafter's step goes
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import contextlib
import cProfile
import hashlib
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

VLLM_METHODS = ("suffix", "ngram")    # replayed by SuffixReplay / NgramReplay, not treespec configs
DEFAULT_CONFIGS = ("prompt-lookup", "prompt-lookup-tree", "demo/ngram-trie", "demo/ngram-trie-tree",
                   "ngram-trie-beam-dart")
INLINE = {
    "ngram-trie-beam-dart": {"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"},
                             "tree": {"builder": "beam", "topk": 4, "width": 4, "max_depth": 8,
                                      "scorer": "dart"}},
    # DART head (fixture:dart-head): tree builders with and without the n-gram signal
    "dart-chain": {"drafter": {"type": "dart", "path": "fixture:dart-head"}, "tree": {"builder": "chain"}},
    "dart-best-first": {"drafter": {"type": "dart", "path": "fixture:dart-head"},
                        "tree": {"builder": "best_first", "topk": 8}},
    "dart-beam-no-ngram": {"drafter": {"type": "dart", "path": "fixture:dart-head"},
                           "tree": {"builder": "beam", "topk": 8, "width": 8}},
}
# JetSpec causal head vs its diffusion-style twin (fixture:jetspec-head, fixture:diffusion-head)
# under chain, best-first and PRESTO prefix-aligned scoring (presets jetspec, diffusion-presto:
# best-first / PRESTO beam): JetSpec Table 7 and PRESTO Table 2 analogues
for _name, _fixture in (("jetspec", "jetspec-head"), ("diffusion", "diffusion-head")):
    _head = {"type": "jetspec", "path": f"fixture:{_fixture}", "topk": 8}
    _rho = {**_head, "ngram": "fixture:stdlib-3gram"}
    INLINE[f"{_name}-chain"] = {"drafter": _head, "tree": {"builder": "chain"}}
    INLINE[f"{_name}-best-first"] = {"drafter": _head, "tree": {"builder": "best_first", "topk": 8}}
    INLINE[f"{_name}-best-first-presto"] = {"drafter": _rho, "tree": {"builder": "best_first", "topk": 8,
                                                                      "scorer": "presto"}}
    INLINE[f"{_name}-beam-presto"] = {"drafter": _rho, "tree": {"builder": "beam", "topk": 8, "width": 8,
                                                                "scorer": "presto"}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="prompt sampling seed (as bench_serving)")
    p.add_argument("--prompts", choices=("held-out", "unseen", "chat"), default="held-out",
                   help="held-out stdlib files (the fixtures' corpus), unseen third-party code, or MT-Bench + "
                        "HumanEval chat requests in the model's chat template (chat_prompts.py; answers end "
                        "at EOS, as bench_matrix serves them)")
    p.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1],
                   help="requests in flight at once (continuous batching; drafters that read "
                        "target states: 1 only)")
    p.add_argument("--configs", nargs="*", default=list(DEFAULT_CONFIGS),
                   help=f"preset names, {', '.join(INLINE)} or suffix (vLLM's suffix method)")
    p.add_argument("--config-json", action="append", default=[], help="extra inline treespec config")
    p.add_argument("--output", type=Path, default=None, help="JSON record (default: print only)")
    p.add_argument("--ratings", action="store_true", help="print each config's rating table")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile each replay and print its N costliest functions (own time): where a "
                        "drafter's step goes, without an engine around it")
    p.add_argument("--costs", type=float, nargs=2, metavar=("ROW", "STEP"), default=None,
                   help="a verified row's and a speculative step's cost in plain steps (one client): "
                        "prints the speedup they imply (served greedy c=1 on SmolLM2 fits about 0.05 0.12)")
    p.add_argument("--calibration", nargs="+", choices=("source", "pooled"), default=["source"],
                   help="with --prune-margin: calibrate ratings per node source (DraftTree.source, as the "
                        "engine does) and/or pooled into one curve (each mode replayed)")
    p.add_argument("--prune-margin", type=float, default=None,
                   help="with --costs: cut treespec drafts as budget.gain.confidence would at those costs "
                        "times this margin (the engine's default margin is 1.5)")
    return p.parse_args(argv)


def reference_outputs(model_dir: Path, prompts: Sequence[Any], max_tokens: int) -> list[dict]:
    """[{prompt_ids, output_ids}] of vLLM greedy decoding without speculation (cached). A prompt
    is a text (completed for exactly max_tokens, ignore_eos) or a chat message list (rendered by
    the model's chat template; the answer ends at EOS)."""
    from treespec_fixtures.cache import cache_root

    meta = (model_dir / "fixture.json").read_text() if (model_dir / "fixture.json").exists() else str(model_dir)
    key = hashlib.sha256(json.dumps([meta, list(prompts), max_tokens]).encode()).hexdigest()[:16]
    path = cache_root() / "replay" / f"greedy-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=1024, seed=0)
    chat = bool(prompts) and not isinstance(prompts[0], str)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not chat)
    if chat:
        outs = llm.chat([list(m) for m in prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(list(prompts), params, use_tqdm=False)
    records = [{"prompt_ids": list(o.prompt_token_ids), "output_ids": list(o.outputs[0].token_ids)}
               for o in outs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    del llm
    return records


def accepted_path(tokens: np.ndarray, parents: np.ndarray, continuation: Sequence[int]) -> list[int]:
    """Nodes of the longest root path whose draft tokens spell a prefix of `continuation`."""
    node, path = 0, []
    while len(path) < len(continuation):
        children = np.nonzero((parents == node) & (tokens == continuation[len(path)]))[0]
        if children.size == 0:
            break
        node = int(children[0])
        path.append(node)
    return path


def accepted_length(tokens: np.ndarray, parents: np.ndarray, continuation: Sequence[int]) -> int:
    """Length of the longest root path whose draft tokens spell a prefix of `continuation`."""
    return len(accepted_path(tokens, parents, continuation))


RATING_BINS = 20
SOURCES = 2          # DraftTree.source values the lookup-trie drafter emits (csrc/lookup/lookup_trie_tree.h)


def rating_table(verified: np.ndarray, accepted: np.ndarray) -> list[dict]:
    """Per path-probability bin of the drafter's own rating (budget/confidence.py): nodes drafted
    and the share accepted, the evidence that budget.gain.confidence calibrates it."""
    return [{"rating": [round(b / RATING_BINS, 3), round((b + 1) / RATING_BINS, 3)], "nodes": int(verified[b]),
             "accepted_share": float(accepted[b] / verified[b])} for b in range(RATING_BINS) if verified[b]]


def target_features(model: Any, records: Sequence[dict], aux_ids: Sequence[int]) -> list[list[Any]]:
    """Per record, the aux hidden states [len, H] of each vLLM aux id, from one HF forward."""
    import torch

    out = []
    with torch.inference_mode():
        for rec in records:
            ids = torch.as_tensor(rec["prompt_ids"] + rec["output_ids"])[None]
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            out.append([hs[j][0] for j in aux_ids])
    return out


def replay(drafter: Any, budget: int, records: Sequence[dict], max_len: int = 1024,
           features: Sequence[list[Any]] | None = None, concurrency: int = 1, ratings: bool = True,
           costs: tuple[float, float] | None = None, prune_margin: float | None = None,
           pooled: bool = False) -> dict:
    """Replay one drafter over every recorded request. `concurrency` requests are in flight at
    once, in order, each finished one replaced by the next (continuous batching); a step drafts
    for every request in flight in one propose call, so drafters that learn from other requests
    see them as a server would. `features`: per record the target's aux hidden states (drafters
    whose capabilities say uses_target_states); `ratings`: tabulate acceptance by the drafter's
    own node ratings (`rating_table`; off for drafters whose trees carry none).

    `costs` = (row, step): what a verified draft row and a speculative step cost, in plain steps
    (at one client, where a plain step emits one token); then `modeled_speedup` = output tokens /
    (steps + row x rows verified + step x speculative steps), the ratio to no speculation those
    costs imply. `prune_margin`: also cut drafts as budget.gain.confidence does with those costs
    held fixed and times the margin: each tree to the longest prefix whose nodes' calibrated
    worth (DraftCalibration over the rating, learnt from the replay's own verified nodes) pays
    for a row, the step's drafts dropped unless their net gain pays for the step; one curve per
    node source (DraftTree.source, as the engine calibrates) or, `pooled`, one for all."""
    from vllm_treespec.drafters import DraftInputs
    from vllm_treespec.drafters.base import TargetStates

    from vllm_treespec.budget.confidence import GREEDY_CLASS, DraftCalibration, batch_sources, path_probs

    steps = drafted_steps = accepted = nodes = 0
    draft_s = 0.0
    rated = np.zeros((SOURCES, RATING_BINS))    # drafted nodes per node source and rating bin
    rated_hits = np.zeros((SOURCES, RATING_BINS))   # (treespec trees only; DraftTree.source)
    slots = max(1, concurrency)
    if features is not None and slots > 1:
        raise ValueError("drafters that read target states replay at concurrency 1 only")
    calibration = DraftCalibration() if prune_margin is not None else None
    rows_verified = spec_steps = 0
    buf = np.zeros((slots, max_len), dtype=np.int32)
    active: list[dict] = []                    # {r, slot, t, committed}
    pending = list(range(len(records)))
    free = list(range(slots - 1, -1, -1))
    while pending or active:
        while pending and free:                # admit: the first output token comes from the prefill
            r, slot = pending.pop(0), free.pop()
            full = records[r]["prompt_ids"] + records[r]["output_ids"]
            buf[slot] = 0
            buf[slot, :len(full)] = full
            active.append({"r": r, "slot": slot, "t": 1, "committed": 0})
        lens = []
        for a in active:
            rec = records[a["r"]]
            lens.append(len(rec["prompt_ids"]) + a["t"])
        target = None
        if features is not None:               # rows committed since the last step: committed..n-2
            a, n = active[0], lens[0]          # concurrency 1 (checked above)
            pos = np.arange(a["committed"], n - 1, dtype=np.int64)
            target = TargetStates(None, features[a["r"]], [pos], [pos])
            a["committed"] = n - 1
        remaining = [len(records[a["r"]]["output_ids"]) - a["t"] for a in active]
        inputs = DraftInputs(req_ids=[f"r{a['r']}" for a in active], token_ids=buf,
                             rows=np.array([a["slot"] for a in active], dtype=np.int64),
                             num_tokens=np.array(lens, dtype=np.int64),
                             budgets=np.array([min(budget, m) for m in remaining], dtype=np.int64),
                             target=target)
        # the drafter may only read the first n tokens of a row; later ones are the future
        saved = [buf[a["slot"], n:].copy() for a, n in zip(active, lens)]
        for a, n in zip(active, lens):
            buf[a["slot"], n:] = 0
        start = time.perf_counter()
        trees = drafter.propose(inputs).trees
        draft_s += time.perf_counter() - start
        for a, n, tail in zip(active, lens, saved):
            buf[a["slot"], n:] = tail
        if calibration is not None:
            trees = prune_by_confidence(list(trees), calibration, prune_margin * costs[0],
                                        prune_margin * costs[1], by_source=not pooled)
        step_rows = sum(t.num_draft for t in trees)
        rows_verified += step_rows
        spec_steps += step_rows > 0
        finished = []
        for a, tree, m in zip(active, trees, remaining):
            out = records[a["r"]]["output_ids"]
            path = accepted_path(tree.tokens, tree.parents, out[a["t"]:]) if tree.num_draft else []
            acc = min(len(path), m - 1)
            if (calibration is not None or ratings) and tree.num_draft:
                probs = path_probs(tree)                        # each node's rating, computed once
                sources = batch_sources([tree])
                hit = np.asarray(path[:acc], dtype=np.int64) - 1   # accepted nodes' indices
                if calibration is not None:
                    accepted_mask = np.zeros(tree.num_draft, dtype=bool)
                    accepted_mask[hit] = True
                    calibration.observe(GREEDY_CLASS, probs, accepted_mask,
                                        None if pooled else sources)
                if ratings:
                    b = np.minimum((probs * RATING_BINS).astype(np.int64), RATING_BINS - 1)
                    np.add.at(rated, (sources, b), 1.0)
                    np.add.at(rated_hits, (sources[hit], b[hit]), 1.0)
            steps += 1
            if tree.num_draft:
                drafted_steps += 1
                nodes += tree.num_draft
                accepted += acc
            a["t"] += acc + 1
            if a["t"] >= len(out):
                finished.append(a)
        for a in finished:
            out = records[a["r"]]["output_ids"]
            if drafter.capabilities.observes_output:
                drafter.observe_output(np.asarray(out, dtype=np.int32))
            drafter.on_requests_finished([f"r{a['r']}"])
            active.remove(a)
            free.append(a["slot"])
    total = sum(len(rec["output_ids"]) - 1 for rec in records)
    modeled = None
    if costs is not None:
        modeled = total / (steps + costs[0] * rows_verified + costs[1] * spec_steps)
    return {"tau": 1 + accepted / max(drafted_steps, 1), "tokens_per_step": total / max(steps, 1),
            "modeled_speedup": modeled, "costs": list(costs) if costs else None, "prune_margin": prune_margin,
            "rows_verified": rows_verified, "speculative_steps": spec_steps,
            "steps": steps, "drafted_steps": drafted_steps, "accepted": accepted,
            "mean_nodes": nodes / max(drafted_steps, 1), "draft_ms_per_step": 1e3 * draft_s / max(steps, 1),
            "drafted_share": drafted_steps / max(steps, 1), "ratings": rating_table(rated.sum(0), rated_hits.sum(0)),
            "ratings_by_source": {str(src): rating_table(rated[src], rated_hits[src])
                                  for src in range(SOURCES) if rated[src].any()},
            "calibration": "pooled" if pooled else "per source"}


def prune_by_confidence(trees: list[Any], calibration: Any, row_cost: float, step_cost: float,
                        by_source: bool = True) -> list[Any]:
    """budget.gain.confidence's cut with fixed costs (see `replay`): each tree to the prefix whose
    calibrated worth (one curve per node source unless `by_source` is false) pays for its rows,
    all of them to nothing if the step's net gain does not pay for a speculative step."""
    from vllm_treespec.budget.confidence import GREEDY_CLASS, batch_path_probs, batch_sources, keep_prefixes

    drafted = [i for i, t in enumerate(trees) if t.num_draft]
    if not drafted:
        return trees
    rated = [trees[i] for i in drafted]
    probs, offsets = batch_path_probs(rated)
    sources = batch_sources(rated) if by_source else None
    kept, net = keep_prefixes(calibration.worth(GREEDY_CLASS, probs, sources), offsets, row_cost)
    kept[net <= 0] = 0
    if net[kept > 0].sum() <= step_cost:
        kept[:] = 0
    for i, n in zip(drafted, kept.tolist()):
        trees[i] = trees[i].prefix(n)
    return trees


class SuffixReplay:
    """vLLM 0.32's `suffix` proposer (v1/spec_decode/suffix_decoding.py) over the replay's
    interface: one arctic_inference SuffixDecodingCache, the request's prompt tree built at its
    first step, its response added as it grows, the last max_tree_depth tokens as the pattern.
    Its drafts are chains."""

    class _Caps:
        observes_output = False
        uses_target_states = False

    capabilities = _Caps()

    def __init__(self, max_tree_depth: int = 24, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, max_cached_requests: int = 10000) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth,
                                         max_cached_requests=max_cached_requests)
        self.depth, self.factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob
        self.seen: dict[str, int] = {}     # req_id -> tokens handed to the cache so far

    def propose(self, inputs: Any) -> Any:
        from vllm_treespec.drafters.base import Proposal, chain_trees

        chains = []
        for req, row, n, budget in zip(inputs.req_ids, inputs.rows, inputs.num_tokens, inputs.budgets):
            tokens, n = inputs.token_ids[int(row)], int(n)
            if req not in self.seen:
                # the first output token came from the prefill: the prompt is everything before it
                self.cache.start_request(req, tokens[:n - 1].copy())
                self.seen[req] = n - 1
            self.cache.add_active_response(req, tokens[self.seen[req]:n].copy())
            self.seen[req] = n
            draft = self.cache.speculate(req, tokens[max(0, n - self.depth):n].copy(),
                                         max_spec_tokens=int(budget), max_spec_factor=self.factor,
                                         min_token_prob=self.min_prob)
            chains.append(list(draft.token_ids))
        return Proposal(chain_trees(inputs, chains))

    def on_requests_finished(self, req_ids: Sequence[str]) -> None:
        for req in req_ids:
            self.cache.stop_request(req)
            self.seen.pop(req, None)


class NgramReplay:
    """vLLM 0.32's `ngram` proposer over the replay's interface: its own longest-suffix match
    (v1/spec_decode/ngram_proposer.py, called directly) over the request's tokens, the match
    range the benchmarks serve it with (harness/comparison.py), `budget` tokens after the match.
    Its drafts are chains."""

    class _Caps:
        observes_output = False
        uses_target_states = False

    capabilities = _Caps()

    def __init__(self, max_model_len: int = 1024) -> None:
        from harness.comparison import NGRAM_MAX, NGRAM_MIN

        self.min_n, self.max_n, self.max_model_len = NGRAM_MIN, NGRAM_MAX, max_model_len

    def propose(self, inputs: Any) -> Any:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        from vllm_treespec.drafters.base import Proposal, chain_trees

        chains = []
        for row, n, budget in zip(inputs.rows, inputs.num_tokens, inputs.budgets):
            tokens = inputs.token_ids[int(row), :int(n)].copy()
            draft = _find_longest_matched_ngram_and_propose_tokens(
                tokens, self.min_n, self.max_n, self.max_model_len, int(budget))
            chains.append([int(t) for t in draft])
        return Proposal(chain_trees(inputs, chains))

    def on_requests_finished(self, req_ids: Sequence[str]) -> None:
        pass


def prompt_texts(kind: str, num: int, seed: int) -> list[Any]:
    """The replay's prompts: held-out stdlib files, unseen third-party function heads (texts), or
    the first `num` chat requests of bench_matrix's MT-Bench + HumanEval pool (message lists)."""
    if kind == "chat":
        from chat_prompts import chat_pool

        return [p.messages for p in chat_pool(seed)[:num]]
    if kind == "unseen":
        from unseen_prompts import build_prompts

        return [p.text for p in build_prompts(num, seed=seed)]
    from vllm_treespec.train.corpus import held_out_prompts

    return held_out_prompts(num, seed=seed)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    from vllm_treespec.config import from_additional_config
    from vllm_treespec.drafters import make_drafter
    from treespec_fixtures import build_fixture

    model_dir = build_fixture(ns.fixture)
    prompts = prompt_texts(ns.prompts, ns.num_prompts, ns.seed)
    records = reference_outputs(model_dir, prompts, ns.max_tokens)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    configs = [(name, INLINE.get(name, name)) for name in ns.configs]
    configs += [(f"inline{i}", json.loads(c)) for i, c in enumerate(ns.config_json)]
    rows = []
    hf_model, features = None, {}
    print(f"{'config':34s} {'budget':>6s} {'conc':>4s} {'tau':>6s} {'tok/step':>8s} {'nodes':>6s} "
          f"{'draft ms':>8s} {'drafted':>6s}{'  modeled' if ns.costs else ''}")

    def make(cfg: Any, budget: int) -> tuple[Any, int, Any]:
        """(drafter, node budget, target features or None) for one config."""
        nonlocal hf_model
        if cfg == "suffix":
            return SuffixReplay(), budget, None
        if cfg == "ngram":
            return NgramReplay(), budget, None
        config = from_additional_config({"treespec": cfg}, budget)
        drafter = make_drafter(config.drafter, str(model_dir), config.tree, max_model_len=1024,
                               max_nodes=config.node_budget(budget), vocab_limit=vocab_size)
        if not drafter.capabilities.uses_target_states:
            return drafter, config.node_budget(budget), None
        if hf_model is None:
            import torch
            from transformers import AutoModelForCausalLM

            hf_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        drafter.load(hf_model)
        key = drafter.capabilities.aux_layers
        if key not in features:
            features[key] = target_features(hf_model, records, key)
        return drafter, config.node_budget(budget), features[key]

    for concurrency in ns.concurrency:
        for budget in ns.budgets:
            for (name, cfg), mode in ((c, m) for c in configs
                                      for m in (ns.calibration if c[1] not in VLLM_METHODS else ["source"])):
                drafter, nodes, feats = make(cfg, budget)   # fresh: nothing learnt from another run
                profiler = cProfile.Profile() if ns.profile else None
                with profiler or contextlib.nullcontext():
                    result = replay(drafter, nodes, records, features=feats, concurrency=concurrency,
                                    ratings=cfg not in VLLM_METHODS, costs=ns.costs,
                                    prune_margin=ns.prune_margin if cfg not in VLLM_METHODS else None,
                                    pooled=mode == "pooled")
                row = {"config": name, "budget": budget, "concurrency": concurrency, **result,
                       "treespec": None if cfg in VLLM_METHODS else cfg}
                rows.append(row)
                modeled = "" if row["modeled_speedup"] is None else f" {row['modeled_speedup']:7.3f}x"
                label = name + ("/pooled" if mode == "pooled" and ns.prune_margin is not None else "")
                print(f"{label:34s} {budget:6d} {concurrency:4d} {row['tau']:6.2f} "
                      f"{row['tokens_per_step']:8.2f} {row['mean_nodes']:6.1f} "
                      f"{row['draft_ms_per_step']:8.3f} {row['drafted_share']:6.2f}{modeled}", flush=True)
                if profiler is not None:
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(ns.profile)
                if ns.ratings:
                    for src, table in row["ratings_by_source"].items():
                        for r in table:
                            print(f"    source {src} rated {r['rating'][0]:.2f}-{r['rating'][1]:.2f}: "
                                  f"{r['nodes']:6d} nodes, {100 * r['accepted_share']:5.1f}% accepted")
    if ns.output is not None:
        from harness.report import git_commit, hardware_info, software_info

        ns.output.write_text(json.dumps({"benchmark": "replay_tau", "hardware": hardware_info(),
                                         "software": software_info(), "commit": git_commit(),
                                         "fixture": ns.fixture, "prompt_source": ns.prompts,
                                         "seed": ns.seed, "prompts": ns.num_prompts,
                                         "max_tokens": ns.max_tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
