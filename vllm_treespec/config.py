"""Deployment config: which drafter, which tree shape, which budget — one file per deployment.

Given to vLLM as `--additional-config '{"treespec": PATH_OR_MAPPING}'`. PATH is a YAML file (an
absolute path or one relative to the working directory) or a shipped preset's name
(`prompt-lookup`; vllm_treespec/presets.py; a source checkout's lab adds `demo/lookup-trie` and the
other `demo/` presets on its fixtures). A mapping (inline or in a file)
may start from a preset with `preset: NAME` and override its keys.
Validated once at startup (and by `vllm-treespec serve` before vLLM starts); any problem raises one
`ConfigError` naming the key, what is allowed and how to fix it. Without a `treespec` entry the
deployment uses the `lookup-online` preset (model-free: prompt lookup plus a trie learnt from the
deployment's own outputs).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from vllm_treespec.presets import (budget_presets, configs_dir, expand_preset,
                                   resolve_budget_path, resolve_config_path)
from vllm_treespec.schema import ConfigError, did_you_mean, parse_section, reference_rows, spec, to_dict

CONFIGS_DIR = configs_dir()
DEFAULT_PRESET = "lookup-online"

# How to make the file a drafter needs (said when its path is missing).
_SERVE_WITH = ("then serve with --additional-config '{{\"treespec\": {{\"preset\": \"PRESET\", "
               "\"drafter\": {{\"{key}\": \"FILE\"}}}}}}' (or set it in a copy of the preset)")
_MAKE_TRIE = ("this drafter needs an n-gram trie built with the served model's tokenizer: make one with "
              "`vllm-treespec ngram build --tokenizer MODEL_DIR --order 3 --out FILE CORPUS...` (or a "
              "self-distilled one: `vllm-treespec train trie MODEL_DIR --out FILE`); "
              + _SERVE_WITH.format(key="path"))
_MAKE_HEAD = ("this drafter needs a head checkpoint trained for the served model: make one with "
              "`vllm-treespec train data MODEL_DIR --out DATA` and `vllm-treespec train dart|jetspec "
              "MODEL_DIR --data DATA --out FILE`; " + _SERVE_WITH.format(key="path"))
_MAKE_DRAFT = ("this drafter needs a local Hugging Face draft model directory (Llama, Mistral, Qwen2, "
               "Qwen3, Mamba, Mamba-2) sharing the served model's tokenizer; "
               + _SERVE_WITH.format(key="path"))
ADDITIONAL_CONFIG_KEY = "treespec"

__all__ = ["ConfigError", "TreespecConfig", "PromptLookupConfig", "LookupTrieConfig", "DraftModelConfig",
           "BudgetConfig", "BudgetRule", "AutoBudgetConfig", "load_config", "from_engine_args",
           "config_reference"]


def _check_ngram_range(section: Any, prefix: str) -> None:
    """Prompt lookup's suffix lengths: min_ngram <= max_ngram."""
    if section.min_ngram > section.max_ngram:
        raise ConfigError(f"{prefix}.min_ngram: {section.min_ngram} is larger than {prefix}.max_ngram "
                          f"({section.max_ngram}); set min_ngram <= max_ngram")


@dataclasses.dataclass(frozen=True)
class PromptLookupConfig:
    """Drafts continuations of the longest earlier match of the request's own suffix."""
    type: Literal["prompt_lookup"] = spec(doc="Drafter kind.")
    min_ngram: int = spec(1, ge=1, le=64, doc="Shortest suffix n-gram that may match.")
    max_ngram: int = spec(4, ge=1, le=64, doc="Longest suffix n-gram tried (longer matches win).")
    max_matches: int = spec(8, ge=1, le=256, doc=(
        "tree.builder best_first: earlier matches (of the longest matched suffix) whose "
        "continuations are merged into the tree; chain uses the best match."))
    continue_prob: float = spec(1.0, doc=(
        "tree.builder best_first: estimated chance that a copied continuation goes on one more "
        "token; nodes rank by log(share of matches) + depth * log(continue_prob), so below 1 "
        "shallow alternatives outrank the majority path's deep tail (1 = by match count). "
        "Range: (0, 1]."))

    def validate(self, prefix: str) -> None:
        if not 0.0 < self.continue_prob <= 1.0:
            raise ConfigError(f"{prefix}.continue_prob: {self.continue_prob} is out of range; allowed "
                              "0 < continue_prob <= 1")
        _check_ngram_range(self, prefix)


@dataclasses.dataclass(frozen=True)
class NgramTrieConfig:
    """Drafts the most likely continuation under a corpus n-gram trie (vllm-treespec ngram build)."""
    type: Literal["ngram_trie"] = spec(doc="Drafter kind.")
    path: str = spec(doc=(
        "Trie file (`vllm-treespec ngram build`, or `vllm-treespec train trie` for a self-distilled "
        "one); its tokenizer fingerprint must match the served model's. A source checkout's demos and "
        "tests name lab fixtures instead (fixture:stdlib-3gram and others: treespec_fixtures, not "
        "installed; vllm_treespec/paths.py)."), missing=_MAKE_TRIE)
    order: int | None = spec(None, ge=1, le=16, doc="Expected trie order; null accepts the file's.")
    k: int = spec(4, ge=1, le=64, doc="Continuations per node a tree builder may expand.")
    min_context: int = spec(1, ge=0, le=15, doc=(
        "Draft a token only if at least this many preceding tokens matched in the trie "
        "(0 also drafts from unigram backoff)."))
    online_mb: float = spec(0.0, ge=0.0, le=4096.0, doc=(
        "Memory for the online layer that learns from this deployment's outputs; 0 = off."))


@dataclasses.dataclass(frozen=True)
class LookupTrieConfig:
    """Prompt lookup mixed with a corpus n-gram trie in one tree (drafters/lookup_trie.py)."""
    type: Literal["lookup_trie"] = spec(doc="Drafter kind.")
    path: str | None = spec(None, doc=(
        "Trie file (as ngram_trie.path). null with online_mb > 0: no corpus, the trie is only the "
        "online layer, learnt from this deployment's outputs (model-free, like prompt lookup)."))
    sampled_path: str | None = spec(None, doc=(
        "Trie for requests that sample (temperature > 0), e.g. one counted from the model's "
        "sampled continuations at the served temperature (`vllm-treespec train trie "
        "--temperature 0.7 --samples-per-prompt 4`); greedy requests keep `path`. "
        "null = `path` for every request."))
    min_ngram: int = spec(1, ge=1, le=64, doc="Shortest suffix n-gram that may match.")
    max_ngram: int = spec(4, ge=1, le=64, doc="Longest suffix n-gram tried (longer matches win).")
    max_matches: int = spec(8, ge=0, le=256, doc=(
        "Earlier matches (of the longest matched suffix) whose continuations are merged; "
        "0 = trie only."))
    lookup_weight: float = spec(0.8, doc=(
        "Share of a node's probability given to the match continuations where the path still "
        "follows one (the trie's top-k get the rest). Range: [0, 1]."))
    order: int | None = spec(None, ge=1, le=16, doc="Expected trie order; null accepts the file's.")
    k: int = spec(4, ge=1, le=64, doc="Trie continuations considered per node.")
    min_context: int = spec(1, ge=0, le=15, doc=(
        "Trie tokens only if at least this many preceding tokens matched in the trie."))
    online_mb: float = spec(0.0, ge=0.0, le=4096.0, doc=(
        "Memory for the trie's online layer that learns from this deployment's outputs; 0 = off."))
    min_path_prob: float = spec(0.0, doc=(
        "Draft only nodes whose path probability (product of the mixture P along the path) is "
        "at least this, even below the budget: every node is a verify row, so guesses the "
        "drafter itself rates unlikely are not drafted. 0 = always fill the budget. Range: [0, 1)."))
    recent_max_ngram: int = spec(0, ge=0, le=64, doc=(
        "Also match the request's suffix (up to this many tokens) in the outputs this deployment "
        "served lately, kept verbatim (recent_mb); the longest match over the request's own "
        "text and those outputs wins. Needs online_mb > 0. 0 = off."))
    depth_per_match: float = spec(0.0, ge=0.0, le=64.0, doc=(
        "Cap a draft's depth at this many tokens per token of the longest suffix match (the "
        "request's own text or recent outputs; the trie's context length where nothing matched), "
        "as SuffixDecoding sizes its drafts: a continuation is only as good as the context that "
        "predicts it. 0 = tree.max_depth only."))
    recent_mb: float = spec(16.0, ge=0.0, le=4096.0, doc=(
        "Memory for the recent outputs searched by recent_max_ngram, index included (about 32 "
        "bytes per token held: 16 MB holds the last ~500k output tokens); the oldest half is "
        "dropped when full."))

    def validate(self, prefix: str) -> None:
        if self.recent_max_ngram and not self.online_mb:
            raise ConfigError(f"{prefix}.recent_max_ngram: {self.recent_max_ngram} needs outputs to "
                              f"search; set {prefix}.online_mb > 0 (outputs are learnt with the online "
                              "layer) or recent_max_ngram: 0")
        if self.recent_max_ngram and self.recent_mb <= 0:
            raise ConfigError(f"{prefix}.recent_mb: {self.recent_mb} leaves no room for recent outputs; "
                              f"set {prefix}.recent_mb > 0 or recent_max_ngram: 0")
        if not 0.0 <= self.min_path_prob < 1.0:
            raise ConfigError(f"{prefix}.min_path_prob: {self.min_path_prob} is out of range; allowed "
                              "0 <= min_path_prob < 1 (0 = fill the budget)")
        if not 0.0 <= self.lookup_weight <= 1.0:
            raise ConfigError(f"{prefix}.lookup_weight: {self.lookup_weight} is out of range; allowed "
                              "0 <= lookup_weight <= 1")
        if self.path is None and not self.online_mb:
            raise ConfigError(f"{prefix}.path: required key is missing; " + _MAKE_TRIE
                              + f" (or, model-free: path null with {prefix}.online_mb > 0, a trie "
                              "learnt only from this deployment's outputs)")
        if self.path is None and self.order is not None:
            from vllm_treespec.native import native    # the trie format's limit, not a schema bound

            most = int(native().ngram.MAX_ORDER)
            if self.order > most:
                raise ConfigError(f"{prefix}.order: {self.order} is too long for a trie learnt online "
                                  f"(path null); allowed 1..{most}, or null for the default")
        _check_ngram_range(self, prefix)


@dataclasses.dataclass(frozen=True)
class DraftModelConfig:
    """An external draft LM (transformer or Mamba, Hugging Face format) drafting trees level by
    level next to the target (drafters/draft_model.py)."""
    type: Literal["draft_model"] = spec(doc="Drafter kind.")
    path: str = spec(doc=(
        "Local Hugging Face model directory (config.json, weights, tokenizer files; architectures "
        "Llama, Mistral, Qwen2, Qwen3, Mamba, Mamba-2; the source checkout's lab also has "
        "fixture:draft-lm / fixture:mamba-draft-lm). Its tokenizer must be the served model's."), missing=_MAKE_DRAFT)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = spec("auto", doc=(
        "Drafter weights and cache dtype; auto = the checkpoint's."))
    memory_mb: float = spec(2048.0, ge=1.0, le=1048576.0, doc=(
        "Bound on the drafter's weights plus per-request caches; startup fails if one request's "
        "cache does not fit."))
    max_cached_requests: int = spec(64, ge=1, le=4096, doc=(
        "Requests whose drafter cache is kept (least recently used evicted); more requests in one "
        "step than cache slots draft nothing that step."))
    topk: int = spec(8, ge=1, le=64, doc="Children considered per expanded node (builders cap it further).")
    templates: tuple[tuple[int, ...], ...] | None = spec(None, doc=(
        "tree.builder static: candidate fan-out templates; a UCB bandit per request picks one each "
        "step (Mamba drafters paper), e.g. [[3, 3, 2, 1], [3, 2, 2, 1, 1], [2, 2, 2, 1, 1, 1]]. "
        "null = tree.template only."))
    bandit_ucb: float = spec(0.1, ge=0.0, le=100.0, doc="templates: UCB exploration weight lambda_ucb.")
    draft_sampling: Literal["auto", "top_k", "sample"] = spec("auto", doc=(
        "Requests with temperature > 0: top_k = the drafter's top-k children, verified with the "
        "target-only rule; sample = children drawn from the drafter's distribution (processed with "
        "the request's temperature/top-k/top-p/min-p), verified by recursive rejection sampling "
        "(tree.builder chain, static or threshold); auto = sample where tree.builder allows it, "
        "else top_k. Greedy requests always get top-k trees."))

    def samples_with(self, builder: str) -> bool:
        """Are sampled requests' trees drawn from q with this tree builder?"""
        from vllm_treespec.tree.sampled import SAMPLED_BUILDERS

        return self.draft_sampling == "sample" or (self.draft_sampling == "auto"
                                                   and builder in SAMPLED_BUILDERS)

    def validate(self, prefix: str) -> None:
        """Each template passes the static builder's own check (as the drafter will call it), so a
        template the builder would refuse fails here at startup, not in the first step."""
        from vllm_treespec.tree import BuildError
        from vllm_treespec.tree.lockstep import builder_steps

        for i, t in enumerate(self.templates or ()):
            try:
                builder_steps("static", 0, 1, template=t).close()
            except BuildError as e:
                raise ConfigError(f"{prefix}.templates[{i}]: {e}") from None


@dataclasses.dataclass(frozen=True)
class DartConfig:
    """A DART parallel draft head (drafters/parallel_head.py): one forward per step over the target's
    hidden states gives d per-depth distributions; the tree builder shapes them."""
    type: Literal["dart"] = spec(doc="Drafter kind.")
    path: str = spec(doc=(
        "Head checkpoint directory (config.json + model.safetensors, from `vllm-treespec train dart` or "
        "`train jetspec`; the source checkout's lab has heads of its code-LM fixture: fixture:dart-head, "
        "fixture:jetspec-head, fixture:diffusion-head). It must be a head of drafter.type's kind, "
        "trained for the served model."),
        missing=_MAKE_HEAD)
    topk: int = spec(25, ge=1, le=256, doc="Candidates kept per depth (DART: k = 25).")
    ngram: str | None = spec(None, doc=(
        "tree.scorer dart / presto: the n-gram trie giving rho (a trie file); "
        "null = no n-gram signal."))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = spec("auto", doc=(
        "Head weights and context-cache dtype; auto = the served model's. A head's draft forward "
        "reads all its weights for a handful of rows, so its cost follows their bytes: bfloat16 "
        "halves them (fast on CPUs with AVX512-BF16 and on GPUs; drafters/heads/NOTES.md). Drafts "
        "may change, outputs never do (verification is exact)."))
    memory_mb: float = spec(512.0, ge=1.0, le=1048576.0, doc=(
        "Bound on the head's per-request context caches; the least recently drafted requests' caches "
        "are evicted past it (they restart at their next committed rows: less context, never wrong "
        "output). Startup fails if one request at max_model_len does not fit."))


@dataclasses.dataclass(frozen=True)
class JetSpecConfig(DartConfig):
    """A JetSpec causal parallel head, or its diffusion-style (bidirectional) twin, whichever the
    checkpoint is (drafters/heads/jetspec.py): one forward per step gives d per-depth
    distributions; same keys as dart."""
    type: Literal["jetspec"] = spec(doc="Drafter kind.")


DRAFTERS: dict[str, type] = {"prompt_lookup": PromptLookupConfig, "ngram_trie": NgramTrieConfig,
                             "lookup_trie": LookupTrieConfig, "draft_model": DraftModelConfig,
                             "dart": DartConfig, "jetspec": JetSpecConfig}


BUILDER_NAMES = ("chain", "best_first", "beam", "threshold", "static")
SCORER_NAMES = ("acc_logp", "dart", "presto", "presto_entropy")
# Which `tree` keys each builder reads (tree.scorer / tree.weights only where a scorer is used).
_BUILDER_KEYS: dict[str, tuple[str, ...]] = {
    "chain": ("max_depth",),
    "best_first": ("topk", "max_depth", "prefetch", "scorer", "weights"),
    "beam": ("topk", "max_depth", "width", "scorer", "weights"),
    "threshold": ("branch", "max_depth", "tau"),
    "static": ("template",),
}
_SCORER_WEIGHTS: dict[str, tuple[str, ...]] = {
    "acc_logp": (),
    "dart": ("logit_decay", "ngram_weight", "level_exponent"),
    "presto": ("lam",),
    "presto_entropy": ("beta", "C"),
}


@dataclasses.dataclass(frozen=True)
class ScorerWeights:
    """Weights of the tree scorer (vllm_treespec.tree.scorers); null keeps the paper's default."""
    logit_decay: float | None = spec(None, doc="dart: per-level decay of the draft log-prob (0.9).")
    ngram_weight: float | None = spec(None, doc="dart: weight of the n-gram continuity score (0.5).")
    level_exponent: float | None = spec(None, doc="dart: level normalisation exponent (-0.7).")
    lam: float | None = spec(None, doc="presto: weight lambda of log rho (0.2).")
    beta: float | None = spec(None, doc="presto_entropy: largest lambda (0.4).")
    C: float | None = spec(None, doc="presto_entropy: entropy half-point (1.0).")

    def given(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    """How drafts are shaped into a tree (builders: vllm_treespec.tree.builders)."""
    builder: Literal["chain", "best_first", "beam", "threshold", "static"] = spec("chain", doc=(
        "Tree builder: chain (fan-out 1), best_first (JetSpec / PRESTO Alg. 2), beam (DART Alg. 1), "
        "threshold (DynaTree), static (per-depth fan-out template)."))
    topk: int | None = spec(None, ge=1, le=1024, doc="best_first, beam: children considered per node.")
    max_depth: int | None = spec(None, ge=1, le=1024, doc="chain, best_first, beam, threshold: deepest level.")
    width: int | None = spec(None, ge=1, le=65536, doc="beam: beam width (DART: 20).")
    prefetch: int | None = spec(None, ge=1, le=1024, doc=(
        "best_first with a draft_model drafter: nodes whose children one drafter call computes (the "
        "node popped and the next likeliest pops, ahead of their turn). Same tree, fewer calls; "
        "null = 4 (one batched call costs about the same for 4 rows as for 1); 1 = node by node."))
    branch: int | None = spec(None, ge=1, le=1024, doc="threshold: children per node (DynaTree: 3).")
    tau: float | None = spec(None, doc="threshold: prune paths below this cumulative probability (0.03).")
    template: tuple[int, ...] | None = spec(None, doc="static: fan-out per depth, e.g. [4, 2, 1].")
    scorer: Literal["acc_logp", "dart", "presto", "presto_entropy"] = spec("acc_logp", doc=(
        "best_first, beam: path score; dart / presto / presto_entropy add the n-gram signal rho."))
    weights: ScorerWeights = spec(default_factory=ScorerWeights, doc="Scorer weights (by scorer).")

    def builder_params(self) -> dict[str, Any]:
        """Keyword arguments for `vllm_treespec.tree.build_tree(self.builder, ...)`."""
        params: dict[str, Any] = {}
        for key in _BUILDER_KEYS[self.builder]:
            if key == "scorer":
                params["scorer"] = self.scorer
            elif key == "weights":
                if self.weights.given():
                    params["scorer_params"] = self.weights.given()
            elif getattr(self, key) is not None:
                params[key] = getattr(self, key)
        return params

    def validate(self, prefix: str) -> None:
        used = _BUILDER_KEYS[self.builder]
        for f in dataclasses.fields(self):
            if f.name in ("builder", "weights", "scorer") or getattr(self, f.name) is None:
                continue
            if f.name not in used:
                raise ConfigError(f"{prefix}.{f.name}: not used by builder {self.builder!r} (it reads "
                                  f"{', '.join(used) or 'no other keys'}); remove the key or change "
                                  f"{prefix}.builder")
        if self.scorer != "acc_logp" and "scorer" not in used:
            raise ConfigError(f"{prefix}.scorer: builder {self.builder!r} scores paths by accumulated "
                              f"log-prob only; use builder best_first or beam for scorer {self.scorer!r}")
        allowed = _SCORER_WEIGHTS[self.scorer]
        for key in self.weights.given():
            if key not in allowed:
                raise ConfigError(f"{prefix}.weights.{key}: not a weight of scorer {self.scorer!r} "
                                  f"(its weights: {', '.join(allowed) or 'none'})")
        _dry_run_build(self, prefix)


def _dry_run_build(tree: TreeConfig, prefix: str) -> None:
    """Build one tiny tree so that out-of-range builder values fail at startup, not mid-serving."""
    import numpy as np

    from vllm_treespec.tree import BuildError, DepthTable, NgramTable, build_tree

    k = max(16, tree.topk or 1, tree.branch or 1, max(tree.template or (1,)))
    depth = max(tree.max_depth or 8, len(tree.template or ()))   # 8 covers the default template
    depth = min(depth, 64)
    tokens = np.tile(np.arange(k, dtype=np.int64), (depth, 1))
    logp = np.log(np.full((depth, k), 1.0 / (k + 1)))
    rho = NgramTable(order=2) if tree.scorer != "acc_logp" else None
    try:
        build_tree(tree.builder, DepthTable(tokens, logp, root=0, rho=rho), 4, **tree.builder_params())
    except (BuildError, ValueError) as e:
        raise ConfigError(f"{prefix}: {e}") from None


@dataclasses.dataclass(frozen=True)
class BudgetTreeOverrides:
    """Tree keys a budget.table rule overrides for its steps (as in the tree section; null = keep)."""
    topk: int | None = spec(None, ge=1, le=1024, doc="best_first, beam: children considered per node.")
    width: int | None = spec(None, ge=1, le=65536, doc="beam: beam width.")
    branch: int | None = spec(None, ge=1, le=1024, doc="threshold: children per node.")
    tau: float | None = spec(None, doc="threshold: prune paths below this cumulative probability.")
    template: tuple[int, ...] | None = spec(None, doc="static: fan-out per depth.")

    def builder_params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclasses.dataclass(frozen=True)
class BudgetRule:
    """One budget.table rule: steps whose batch size (and context length) fall in its ranges get
    its node budget."""
    batch: tuple[int | None, ...] = spec(doc=(
        "[first, last] batch sizes (requests decoding in the step), inclusive; last null = no upper "
        "limit, e.g. [1, 4] or [17, null]. Rules may not overlap and must cover 1 and up."))
    nodes: int = spec(ge=0, le=1024, doc=(
        "Draft nodes per request; 0 = plain decoding for these steps (no drafter call, no tree)."))
    context: tuple[int | None, ...] | None = spec(None, doc=(
        "[first, last] context lengths in tokens, inclusive (last null = no limit); null = any. "
        "Where rules name context ranges they must cover every context length."))
    max_depth: int | None = spec(None, ge=1, le=1024, doc=(
        "Deepest tree level for these steps; null = tree.max_depth."))
    tree: BudgetTreeOverrides = spec(default_factory=BudgetTreeOverrides, doc=(
        "Builder keys overridden for these steps (topk, width, branch, tau, template)."))

    def validate(self, prefix: str) -> None:
        for name, least in (("batch", 1), ("context", 0)):
            rng = getattr(self, name)
            if rng is not None and (len(rng) != 2 or rng[0] is None or rng[0] < least
                                    or rng[1] is not None and rng[1] < rng[0]):
                raise ConfigError(f"{prefix}.{name}: {list(rng)} is not a range; write [first, last] with "
                                  f"{least} <= first <= last (last null = no upper limit), e.g. "
                                  f"[{least}, {least + 3}] or [{least + 4}, null]")


@dataclasses.dataclass(frozen=True)
class BudgetPresetFile:
    """A budget preset file (configs/budgets/*.yaml): a table."""
    table: tuple[BudgetRule, ...] = spec(doc="The table rules (as budget.table).")


@dataclasses.dataclass(frozen=True)
class AutoBudgetConfig:
    """budget.mode auto: pick the budget maximising predicted accepted tokens per second online."""
    candidates: tuple[int, ...] | None = spec(None, doc=(
        "Node budgets to choose from (0 = plain decoding); null = 0, the powers of two below the "
        "largest budget and the largest (max_nodes, else num_speculative_tokens)."))
    margin: float = spec(0.05, ge=0.0, le=10.0, doc=(
        "Switch away from a batch-size bucket's current budget only when the best candidate's "
        "predicted tokens/s beats it by this fraction ..."))
    patience: int = spec(3, ge=1, le=100000, doc="... in this many consecutive decisions of the bucket.")
    explore_every: int = spec(64, ge=0, le=1000000, doc=(
        "Every n-th decision of a batch-size bucket tries a neighbouring candidate (alternately "
        "larger and smaller) so unchosen budgets' acceptance stays measured; 0 = off."))
    ema: float = spec(0.1, doc=(
        "Weight of a new step in the moving averages of verify cost, drafter time and tree fill. "
        "Range: (0, 1]."))
    accept_ema: float = spec(0.02, doc=(
        "Weight of a new request-step in the moving average of accepted tokens per budget. Range: (0, 1]."))
    prior_gain: float = spec(0.75, ge=0.0, le=64.0, doc=(
        "Acceptance prior: min(b, prior_gain * log2(1 + b)) accepted tokens per request-step at "
        "budget b ..."))
    prior_weight: float = spec(8.0, ge=0.0, le=1000000.0, doc="... worth this many request-steps.")
    profile: tuple[tuple[float, ...], ...] | None = spec(None, doc=(
        "Verify cost points [[query_tokens, seconds], ...] seeding the cost model; null = measure "
        "them at startup (startup_profile) or learn from served steps only."))
    startup_profile: bool = spec(True, doc=(
        "With profile null: time the target's forward at 1, 2, 4, ... query tokens (up to "
        "max_num_seqs x (1 + largest budget), capped by max_num_batched_tokens) after vLLM's "
        "warm-up, before serving; false = learn the cost from served steps only."))

    def validate(self, prefix: str) -> None:
        if self.candidates is not None:
            if not self.candidates:
                raise ConfigError(f"{prefix}.candidates: empty; list node budgets, e.g. [0, 4, 8, 16], "
                                  "or null for the default")
            for i, c in enumerate(self.candidates):
                if not 0 <= c <= 1024:
                    raise ConfigError(f"{prefix}.candidates[{i}]: {c} is out of range; "
                                      "allowed 0 <= budget <= 1024")
        for name in ("ema", "accept_ema"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"{prefix}.{name}: {getattr(self, name)} is out of range; "
                                  f"allowed 0 < {name} <= 1")
        for i, point in enumerate(self.profile or ()):
            if len(point) != 2 or point[0] < 1 or point[1] <= 0:
                raise ConfigError(f"{prefix}.profile[{i}]: {list(point)} is not a cost point; write "
                                  "[query_tokens, seconds] with query_tokens >= 1 and seconds > 0")


@dataclasses.dataclass(frozen=True)
class GainConfig:
    """budget.gain: per-request gain control (budget/gain.py)."""
    enabled: bool = spec(False, doc=(
        "Each request drafts only the nodes whose measured acceptance pays for their measured "
        "verification cost at the current load, and stops drafting when none do (probed again "
        "now and then); caps the mode's budget per request."))
    probe_every: int = spec(8, ge=1, le=100000, doc=(
        "Steps a request that stopped drafting waits before a probe draft (unseeded requests "
        "probe together, on the steps that are multiples of their interval) ..."))
    max_probe_every: int = spec(64, ge=1, le=1000000, doc=(
        "... doubling after each probe not accepted to its end, up to this many (a probe "
        "accepted whole, or drafting that pays again, resets it)."))
    probe_nodes: int = spec(2, ge=1, le=1024, doc="Nodes of a probe draft.")
    shadow_probes: bool = spec(True, doc=(
        "A probe of a request that is not seeded is not verified: its tree is walked with the "
        "tokens the request samples next, which accepts the same path in distribution for "
        "drafts without q, so probes never make a step speculative (budget/shadow.py). Seeded "
        "requests, and drafters that sample their drafts or read the target's states, keep "
        "verified probes."))
    fixed_row_cost: float = spec(0.05, ge=0.0, le=1.0, doc=(
        "Seeded sampled requests: the cost of a verified row in tokens (their trees, and so their "
        "tokens, must not depend on other traffic, so measured costs are not used for them) ..."))
    fixed_request_cost: float = spec(0.5, ge=0.0, le=64.0, doc=(
        "... and the fixed cost of drafting at all in a step, in tokens."))
    margin: float = spec(1.5, ge=1.0, le=100.0, doc=(
        "Measured costs are multiplied by this before deciding: drafts the cost model rates "
        "break-even measured slower than no drafts (costs it does not see), so a request drafts "
        "only what clearly pays."))
    confidence: bool = spec(False, doc=(
        "Greedy requests draft every step and keep the longest prefix of their tree whose "
        "nodes' calibrated acceptance pays for their rows; calibration maps the drafter's own "
        "path probability to measured acceptance (budget/confidence.py). Off, and for sampled "
        "requests: drafting is decided from each request's past acceptance, with probes. "
        "Any drafter: greedy trees are never drawn from a drafter's q."))
    calibrate_score: bool = spec(True, doc=(
        "With confidence on: a node is scored by the larger of its drafter's rating and its "
        "request's own reach at its depth, and the score is calibrated on what was accepted. "
        "false: the rating alone is calibrated and the larger of the calibrated rating and the "
        "reach is the node's worth (the earlier rule, kept to measure one against the other)."))
    guard: bool = spec(True, doc=(
        "Now and then the server runs windows of steps with drafting allowed and paused, "
        "alternated, and compares the tokens per second they emitted; while drafted steps are "
        "slower by more than 4% and by more than the windows' own spread explains, drafting "
        "stays paused (seeded sampled requests excepted), until the next test (about 1000 steps later, or when the batch size halves or doubles). "
        "It catches what the cost model does not see (budget/guard.py)."))
    calibrate_every: int = spec(32, ge=0, le=100000, doc=(
        "Every this many steps no unseeded request drafts (0 = never): the step cost model "
        "needs steps of different sizes to tell the cost of a verified row from the cost of the "
        "step, and when every request drafts every step it sees none. With confidence on, the "
        "step half way between two of them is an exploration step: rated greedy drafts keep "
        "their nodes worth at least half a token whatever a row costs, so draft rows keep "
        "being measured."))

    def validate(self, prefix: str) -> None:
        if self.max_probe_every < self.probe_every:
            raise ConfigError(f"{prefix}.max_probe_every: {self.max_probe_every} is below "
                              f"{prefix}.probe_every ({self.probe_every}); raise it or lower probe_every")


BUDGET_MODES = ("fixed", "table", "auto")


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """How many draft nodes a request may get per step."""
    max_nodes: int | None = spec(None, ge=1, le=1024, doc=(
        "Most draft tokens per request and step; null = num_speculative_tokens of "
        "--speculative-config. Must not exceed num_speculative_tokens. Modes table and auto: "
        "caps every choice."))
    mode: Literal["fixed", "table", "auto"] = spec("fixed", doc=(
        "fixed = max_nodes every step; table = by batch size (and context length) from "
        "budget.preset or budget.table; auto = online choice among budget.auto.candidates."))
    preset: str | None = spec(None, doc=(
        "mode table: a table file, by name in configs/budgets/ (cpu, h100, h200) or as a path."))
    table: tuple[BudgetRule, ...] | None = spec(None, doc=(
        "mode table: inline rules, e.g. [{batch: [1, 4], nodes: 16}, {batch: [5, null], nodes: 0}]; "
        "keys per rule: budget.table[].*"))
    auto: AutoBudgetConfig = spec(default_factory=AutoBudgetConfig, doc="mode auto: parameters.")
    reach_floor: float = spec(0.0, ge=0.0, le=0.99, doc=(
        "Cap each request's nodes at the deepest level it reaches with at least this probability, "
        "learnt from its own accepted drafts (budget/reach.py); 0 = off. Sampled requests accept far "
        "fewer of a drafter's tokens than greedy ones; this stops verifying rows they rarely get to."))
    gain: GainConfig = spec(default_factory=GainConfig, doc="Per-request gain control: parameters.")

    def validate(self, prefix: str) -> None:
        if self.mode != "table":
            for name in ("preset", "table"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{prefix}.{name}: used only with {prefix}.mode table (mode is "
                                      f"{self.mode!r}); set mode: table or remove {name}")
        if self.mode != "auto" and self.auto != AutoBudgetConfig():
            raise ConfigError(f"{prefix}.auto: used only with {prefix}.mode auto (mode is {self.mode!r}); "
                              "set mode: auto or remove auto")
        if self.mode == "table":
            if self.preset is None and self.table is None:
                raise ConfigError(f"{prefix}.table: mode table needs rules; set {prefix}.preset (one of "
                                  f"{', '.join(budget_presets()) or 'none found'}, or a YAML path) or an "
                                  f"inline {prefix}.table")
            if self.preset is not None and self.table is not None:
                raise ConfigError(f"{prefix}.preset: give either preset or table, not both; remove one")
            from vllm_treespec.budget import make_budget_policy

            make_budget_policy(self, 1024)   # checks ranges: no overlap, every batch size covered

    def rules(self) -> tuple[BudgetRule, ...]:
        """mode table: the inline rules or the preset file's."""
        if self.table is not None:
            return self.table
        return _read_budget_preset(str(resolve_budget_preset(self.preset)))

    def rules_key(self) -> str:
        """The config key of the rules in error messages."""
        if self.table is not None:
            return "budget.table"
        return f"budget.preset {resolve_budget_preset(self.preset)}: table"

    def largest(self, num_speculative_tokens: int) -> int:
        """The most nodes any step may get (>= 1, to size drafter buffers)."""
        cap = self.max_nodes or num_speculative_tokens
        if self.mode == "table":
            return max(1, min(cap, max(r.nodes for r in self.rules())))
        if self.mode == "auto" and self.auto.candidates is not None:
            return max(1, min(cap, max(self.auto.candidates)))
        return cap

    def check_nodes(self, num_speculative_tokens: int) -> None:
        """Every budget fits num_speculative_tokens (vLLM sizes draft slots by it)."""
        nst = num_speculative_tokens
        if self.max_nodes is not None and self.max_nodes > nst:
            raise ConfigError(
                f"budget.max_nodes: {self.max_nodes} exceeds num_speculative_tokens="
                f"{nst} of --speculative-config; lower max_nodes or raise "
                "num_speculative_tokens")
        if self.max_nodes is not None:
            return   # max_nodes caps every choice of table and auto
        if self.mode == "table":
            rules, key = self.rules(), self.rules_key()
            for i, r in enumerate(rules):
                if r.nodes > nst:
                    raise ConfigError(
                        f"{key}[{i}].nodes: {r.nodes} exceeds num_speculative_tokens={nst} of "
                        f"--speculative-config; raise num_speculative_tokens to "
                        f"{max(x.nodes for x in rules)} or set budget.max_nodes to cap the table")
        if self.mode == "auto":
            for i, c in enumerate(self.auto.candidates or ()):
                if c > nst:
                    raise ConfigError(
                        f"budget.auto.candidates[{i}]: {c} exceeds num_speculative_tokens={nst} of "
                        "--speculative-config; raise num_speculative_tokens, lower the candidate or set "
                        "budget.max_nodes to cap the candidates")


def resolve_budget_preset(name: str | None) -> Path:
    """A budget table file: a name in configs/budgets/, or an existing YAML path."""
    return resolve_budget_path(name)


_PRESET_CACHE: dict[tuple[str, int], tuple[BudgetRule, ...]] = {}


def _read_budget_preset(path: str) -> tuple[BudgetRule, ...]:
    """The rules of a preset file (cached by path and modification time)."""
    key = (path, Path(path).stat().st_mtime_ns)
    if key not in _PRESET_CACHE:
        try:
            _PRESET_CACHE[key] = parse_section(BudgetPresetFile, read_yaml(Path(path)), "").table
        except ConfigError as e:
            msg = str(e)
            if not msg.startswith("treespec config"):   # read_yaml names the file itself
                msg = f"budget.preset {path}: {msg}"
            raise ConfigError(msg) from None
    return _PRESET_CACHE[key]


@dataclasses.dataclass(frozen=True)
class TreespecConfig:
    """A whole deployment (the `treespec` entry of --additional-config)."""
    drafter: Any = spec(doc="Drafter section; `type` selects the kind: " + ", ".join(DRAFTERS) + ".")
    tree: TreeConfig = spec(default_factory=TreeConfig, doc="Tree shape section.")
    budget: BudgetConfig = spec(default_factory=BudgetConfig, doc="Budget section.")
    source: str = spec("<inline>", doc="Where the config came from (set by the loader).")

    def node_budget(self, num_speculative_tokens: int) -> int:
        """The most draft nodes a request may get in any step (budget.max_nodes in mode fixed)."""
        return self.budget.largest(num_speculative_tokens)

    def as_dict(self) -> dict[str, Any]:
        return to_dict(self)


def _parse_drafter(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"drafter: expected a mapping with a `type` key (one of {', '.join(DRAFTERS)}), got {raw!r}")
    kind = raw.get("type")
    if kind not in DRAFTERS:
        raise ConfigError(f"drafter.type: {kind!r} is not a known drafter{did_you_mean(kind, DRAFTERS)}; "
                          "choose one of "
                          + ", ".join(repr(k) for k in DRAFTERS))
    return parse_section(DRAFTERS[kind], raw, "drafter")


def parse_config(raw: Any, source: str = "<inline>", num_speculative_tokens: int | None = None) -> TreespecConfig:
    """Validate a config mapping; errors are prefixed with `source`."""
    try:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"expected a mapping with keys drafter, tree, budget; got {raw!r}")
        if "source" in raw:
            raise ConfigError("source: unknown key; allowed keys are budget, drafter, tree")
        if "drafter" not in raw:
            raise ConfigError("drafter: required key is missing; e.g. drafter: {type: prompt_lookup}")
        body = dict(raw)
        errors, drafter, cfg = [], None, None
        try:                        # the drafter's and the other sections' errors, together
            drafter = _parse_drafter(body.pop("drafter"))
        except ConfigError as e:
            errors.append(str(e))
        try:
            cfg = parse_section(TreespecConfig, {**body, "drafter": {}, "source": source}, "")
        except ConfigError as e:
            errors.append(str(e))
        if errors:
            raise ConfigError("; ".join(errors))
        cfg = dataclasses.replace(cfg, drafter=drafter)
        _check_drafter_tree(cfg)
        _check_budget_tree(cfg)
        if num_speculative_tokens is not None:
            _check_budget(cfg, num_speculative_tokens)
        return cfg
    except ConfigError as e:
        raise ConfigError(f"treespec config {source}: {e}") from None


# Builders a drafter can feed: prompt lookup shapes its own tree from its matches.
_DRAFTER_BUILDERS: dict[str, tuple[str, ...]] = {
    "prompt_lookup": ("chain", "best_first"),
    "ngram_trie": BUILDER_NAMES,
    "lookup_trie": ("chain", "best_first"),
    "draft_model": ("chain", "best_first", "threshold", "static"),
    "dart": ("chain", "best_first", "beam", "threshold", "static"),
    "jetspec": ("chain", "best_first", "beam", "threshold", "static"),
}
# Drafters that rank their own tree nodes (match counts, mixture probabilities): of the builder
# keys only tree.max_depth applies.
_SELF_RANKING = {"prompt_lookup": "match counts", "lookup_trie": "mixture probabilities"}


def _check_drafter_tree(cfg: TreespecConfig) -> None:
    allowed = _DRAFTER_BUILDERS[cfg.drafter.type]
    if cfg.tree.builder not in allowed:
        raise ConfigError(f"tree.builder: {cfg.tree.builder!r} cannot shape {cfg.drafter.type} drafts; "
                          f"choose one of {', '.join(repr(b) for b in allowed)}")
    if cfg.tree.prefetch is not None and cfg.drafter.type != "draft_model":
        raise ConfigError(f"tree.prefetch: only draft_model drafters expand best_first nodes with a "
                          f"model call each; {cfg.drafter.type} drafts do not, remove tree.prefetch")
    ranking = _SELF_RANKING.get(cfg.drafter.type)
    if ranking and cfg.tree.builder_params().keys() - {"max_depth", "scorer"}:
        raise ConfigError(f"tree: {cfg.drafter.type} ranks tree nodes by {ranking}; of the builder keys "
                          "only tree.max_depth applies (remove the others)")
    if ranking and cfg.tree.scorer != "acc_logp":
        raise ConfigError(f"tree.scorer: {cfg.drafter.type} ranks tree nodes by {ranking}; remove tree.scorer")
    from vllm_treespec.tree.scorers import SCORERS

    if (cfg.drafter.type in ("dart", "jetspec") and SCORERS[cfg.tree.scorer].needs_rho
            and cfg.drafter.ngram is None):
        raise ConfigError(f"tree.scorer: {cfg.tree.scorer} scores with an n-gram signal; set drafter.ngram "
                          "to a trie file built with the served model's tokenizer (`vllm-treespec ngram "
                          "build --tokenizer MODEL_DIR --out FILE CORPUS...`) or use tree.scorer acc_logp")
    if cfg.drafter.type == "draft_model":
        if cfg.drafter.templates and cfg.tree.builder != "static":
            raise ConfigError(f"drafter.templates: the template bandit needs tree.builder static, not "
                              f"{cfg.tree.builder!r}; remove drafter.templates or set tree.builder: static")
        if cfg.tree.scorer != "acc_logp":
            raise ConfigError("tree.scorer: draft_model trees rank paths by the drafter's accumulated "
                              "log-prob; remove tree.scorer")
        from vllm_treespec.tree.sampled import SAMPLED_BUILDERS

        if cfg.drafter.draft_sampling == "sample" and cfg.tree.builder not in SAMPLED_BUILDERS:
            raise ConfigError(f"drafter.draft_sampling: sample needs a tree.builder that keeps draws in "
                              f"draw order ({', '.join(SAMPLED_BUILDERS)}); {cfg.tree.builder!r} ranks "
                              "children by value. Set draft_sampling: top_k or change tree.builder")


def _check_budget(cfg: TreespecConfig, num_speculative_tokens: int) -> None:
    cfg.budget.check_nodes(num_speculative_tokens)


def _check_budget_tree(cfg: TreespecConfig) -> None:
    """Table rules override only tree keys the builder reads, with values it accepts."""
    if cfg.budget.mode != "table":
        return
    builder, used = cfg.tree.builder, _BUILDER_KEYS[cfg.tree.builder]
    ranking = _SELF_RANKING.get(cfg.drafter.type)
    key = cfg.budget.rules_key()
    checked = set()
    for i, rule in enumerate(cfg.budget.rules()):
        overrides = rule.tree.builder_params()
        if rule.max_depth is not None and "max_depth" not in used:
            raise ConfigError(f"{key}[{i}].max_depth: not used by builder {builder!r} (it reads "
                              f"{', '.join(used)}); remove it or change tree.builder")
        for name in overrides:
            if ranking:
                raise ConfigError(f"{key}[{i}].tree.{name}: {cfg.drafter.type} ranks tree nodes by "
                                  f"{ranking}; of the builder keys only max_depth applies (remove it)")
            if name not in used:
                raise ConfigError(f"{key}[{i}].tree.{name}: not used by builder {builder!r} (it reads "
                                  f"{', '.join(used)}); remove it or change tree.builder")
        if "template" in overrides and cfg.drafter.type == "draft_model" and cfg.drafter.templates:
            raise ConfigError(f"{key}[{i}].tree.template: drafter.templates lets the bandit choose the "
                              "template per request; remove one of the two")
        if rule.max_depth is not None:
            overrides["max_depth"] = rule.max_depth
        frozen = tuple(sorted(overrides.items()))
        if overrides and frozen not in checked:
            checked.add(frozen)
            _dry_run_build(dataclasses.replace(cfg.tree, **overrides), f"{key}[{i}]")


def resolve_path(name: str) -> Path:
    """Find a config file: as given, or a shipped preset's name (presets.py)."""
    return resolve_config_path(name)


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"treespec config {path}: not valid YAML: {e}") from None
    except OSError as e:
        raise ConfigError(f"treespec config {path}: cannot be read: {e}") from None


def load_config(source: str | Mapping[str, Any] | None,
                num_speculative_tokens: int | None = None) -> TreespecConfig:
    """Load and validate the deployment config from a path, a preset name or an inline mapping."""
    if source is None:
        source = DEFAULT_PRESET
    if isinstance(source, Mapping):
        raw, name = source, "<inline>"
    elif isinstance(source, str):
        path = resolve_path(source)
        raw, name = read_yaml(path), str(path)
    else:
        raise ConfigError(f"--additional-config {ADDITIONAL_CONFIG_KEY}: expected a YAML path, a preset "
                          f"name or a mapping, got {source!r}")
    raw, bases = expand_preset(raw, read_yaml, name)
    files = ([name] if isinstance(source, str) else []) + bases
    if bases:
        name = f"{name} (preset {' <- '.join(bases)})"
    try:
        return parse_config(raw, name, num_speculative_tokens)
    except ConfigError as e:
        raise ConfigError(_with_preset_name(str(e), files)) from None


def _with_preset_name(message: str, files: list[str]) -> str:
    """Name the production preset in a missing-file hint (`"preset": "PRESET"`), or, for a config
    that is not one, say to set the key in it."""
    shipped = CONFIGS_DIR / "drafters"
    names = [Path(f).stem for f in files if Path(f).parent == shipped]
    if names:
        return message.replace('"preset": "PRESET"', f'"preset": "{names[-1]}"')
    return re.sub(r"then serve with --additional-config '.*?' \(or set it in a copy of the preset\)",
                  "then set that key in this config to the file", message)


def from_additional_config(additional_config: Any, num_speculative_tokens: int | None = None) -> TreespecConfig:
    """The deployment config named by vLLM's `--additional-config` (its `treespec` entry)."""
    if additional_config is None:
        additional_config = {}
    if not isinstance(additional_config, Mapping):
        raise ConfigError(f"--additional-config must be a JSON object, got {additional_config!r}")
    return load_config(additional_config.get(ADDITIONAL_CONFIG_KEY), num_speculative_tokens)


def from_engine_args(speculative_config: Any, additional_config: Any) -> TreespecConfig | None:
    """The deployment config of an engine whose speculative config names treespec's proposer,
    or None for any other speculative method (what a front end checks before vLLM starts)."""
    if not isinstance(speculative_config, Mapping) or "TreeProposer" not in str(speculative_config.get("model", "")):
        return None
    k = speculative_config.get("num_speculative_tokens")
    return from_additional_config(additional_config, k if isinstance(k, int) else None)


def config_reference() -> str:
    """Markdown table of every config key (rendered into docs/configuration.md)."""
    rows = []
    for row in reference_rows(TreespecConfig):
        if row[0] not in ("source", "drafter"):
            rows.append(row)
        if row[0] == "budget.table":
            rows.extend(reference_rows(BudgetRule, "budget.table[]"))
    for kind, cls in DRAFTERS.items():
        rows.append((f"drafter (type: {kind})", "mapping", "", (cls.__doc__ or "").strip()))
        rows.extend(r for r in reference_rows(cls, "drafter"))
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {t} | {d and f'`{d}`'} | {doc} |" for k, t, d, doc in rows]
    return "\n".join(lines)
