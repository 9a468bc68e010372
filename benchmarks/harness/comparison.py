"""Side-by-side serving comparison: one server per configuration, the same prompts, ratios.

Speedups are only meaningful as ratios measured in one run on one machine (docs/design.md section 10),
so demo and benchmark both go through `run_comparison` (measure) and `summarize` (derive rows).
The math lives in small pure functions so it is unit-tested without a server.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from harness.serving import CPU_SERVE_ARGS, LoadResult, SpecMetrics, run_load, scrape_spec_metrics, serve

NGRAM_MIN = 1   # the n-gram range of the `prompt-lookup` preset; vLLM's ngram uses the same
NGRAM_MAX = 4


@dataclass(frozen=True)
class ServeConfig:
    """A named set of extra `serve` flags (the speculation settings under comparison)."""
    name: str
    args: tuple[str, ...] = ()


def no_spec() -> ServeConfig:
    return ServeConfig("off")


def ngram_engine_kwargs(k: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX) -> dict[str, Any]:
    """`LLM(...)` keyword arguments of vLLM's ngram with `k` tokens (served: `vllm_ngram`)."""
    return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                   "prompt_lookup_min": min_n, "prompt_lookup_max": max_n}}


def vllm_draft_engine_kwargs(k: int, draft_dir: str) -> dict[str, Any]:
    """`LLM(...)` keyword arguments of vLLM's own `draft_model` method (linear drafts of `k`
    tokens from the local model directory `draft_dir`; served: `vllm_draft_model`)."""
    return {"speculative_config": {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k}}


def treespec_engine_kwargs(k: int, preset: str | dict = "prompt-lookup") -> dict[str, Any]:
    """`LLM(...)` keyword arguments of treespec with `k` speculative tokens and a preset name,
    YAML path or inline config (served: `treespec`)."""
    return {"speculative_config": {"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": k},
            "additional_config": {"treespec": preset}}


def treespec_value(text: str) -> str | dict:
    """A `treespec` value given as text on a command line: inline JSON when it starts with "{",
    else a preset name or YAML path (passed on as is)."""
    return json.loads(text) if text.lstrip().startswith("{") else text


def vllm_ngram(k: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX) -> ServeConfig:
    spec = ngram_engine_kwargs(k, min_n, max_n)["speculative_config"]
    return ServeConfig(f"vllm-ngram K={k}", ("--speculative-config", json.dumps(spec)))


def vllm_draft_model(k: int, draft_dir: str) -> ServeConfig:
    spec = vllm_draft_engine_kwargs(k, draft_dir)["speculative_config"]
    return ServeConfig(f"vllm-draft K={k}", ("--speculative-config", json.dumps(spec)))


def treespec(k: int, preset: str | dict = "prompt-lookup", label: str | None = None) -> ServeConfig:
    """treespec with `k` speculative tokens (= the node budget) and a preset name or inline config."""
    kw = treespec_engine_kwargs(k, preset)
    name = label or (preset if isinstance(preset, str) else "inline")
    return ServeConfig(f"treespec {name} K={k}", ("--speculative-config", json.dumps(kw["speculative_config"]),
                                                  "--additional-config", json.dumps(kw["additional_config"])))


@dataclass
class Measurement:
    """One configuration at one concurrency: the load run and the spec-counter deltas over it."""
    config: str
    concurrency: int
    load: LoadResult
    spec: SpecMetrics


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_comparison(model_dir: str, configs: Sequence[ServeConfig], prompts: Sequence[Any], *,
                   max_tokens: int, concurrencies: Sequence[int] = (1,),
                   warmup_prompts: Sequence[Any] = (), warmup_max_tokens: int = 16,
                   temperature: float = 0.0, ignore_eos: bool = True,
                   base_args: Sequence[str] = CPU_SERVE_ARGS,
                   log: Callable[[str], None] = _stderr) -> list[Measurement]:
    """Serve `model_dir` once per config (`base_args` + the config's flags); after a warm-up, run
    `prompts` (text or chat) at each concurrency.

    Counters are scraped right before and after each measured run, so warm-up and other runs on
    the same server never leak into a row.
    """
    out: list[Measurement] = []
    for cfg in configs:
        log(f"[{cfg.name}] starting server ...")
        with serve(model_dir, cfg.args, base_args=base_args) as server:
            if warmup_prompts:
                run_load(server, warmup_prompts, max_tokens=warmup_max_tokens,
                         concurrency=max(concurrencies), temperature=temperature, ignore_eos=ignore_eos)
            for c in concurrencies:
                before = scrape_spec_metrics(server)
                load = run_load(server, prompts, max_tokens=max_tokens, concurrency=c,
                                temperature=temperature, ignore_eos=ignore_eos)
                delta = scrape_spec_metrics(server) - before
                out.append(Measurement(cfg.name, c, load, delta))
                tau = delta.tau
                log(f"[{cfg.name}] concurrency {c}: {load.tokens_per_s:.1f} tok/s"
                    + (f", tau {tau:.2f}" if tau is not None else ""))
    return out


# -- derived numbers (pure) ----------------------------------------------------------------

def median_measurements(rounds: Sequence[Sequence[Measurement]]
                        ) -> tuple[list[Measurement], dict[tuple[str, int], list[float]]]:
    """Per (config, concurrency), the round with the median tokens/s (the lower middle for an
    even count), in the first round's order, plus every round's tokens/s.

    A shared machine's speed drifts over minutes (this project's dev VM: +-20% for one config);
    repeating the whole sweep and keeping each row's median round keeps one slow phase from
    deciding a ratio, while every number in a row still comes from one real run.
    """
    samples: dict[tuple[str, int], list[Measurement]] = {}
    for measurements in rounds:
        for m in measurements:
            samples.setdefault((m.config, m.concurrency), []).append(m)
    chosen, rates = [], {}
    for key, ms in samples.items():
        ranked = sorted(ms, key=lambda m: m.load.tokens_per_s)
        chosen.append(ranked[(len(ranked) - 1) // 2])
        rates[key] = [m.load.tokens_per_s for m in ms]
    return chosen, rates


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), as numpy's default; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def exact_matches(outputs: Sequence[Any], reference: Sequence[Any]) -> tuple[int, int]:
    """(identical outputs, total), position by position."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs vs {len(reference)} reference outputs")
    return sum(a == b for a, b in zip(outputs, reference)), len(reference)


def tokens_per_step(output_tokens: int, accepted: float) -> float | None:
    """Tokens emitted per request step over all steps, drafted or not.

    Every step of a request emits one token plus its accepted drafts, so steps = output - accepted.
    Unlike tau (which counts only steps that had a draft) this includes steps where the drafter
    found nothing, so it bounds the speedup speculation can give.
    """
    steps = output_tokens - accepted
    return output_tokens / steps if steps > 0 else None


def summarize(measurements: Sequence[Measurement], baseline: str,
              reference: str | None = None, compare_outputs: bool = True) -> list[dict[str, Any]]:
    """One row per (config, concurrency): throughput, tau, latencies, exact match and speedups.

    Exact match and speedups compare against `baseline` (speculation off) at the same
    concurrency; `reference` (e.g. vLLM's ngram) gets its own speedup column. Sampled runs pass
    ``compare_outputs=False`` (unseeded samples differ run to run; exact_match is then None).
    """
    by_key = {(m.config, m.concurrency): m for m in measurements}
    rows = []
    for m in measurements:
        base = by_key.get((baseline, m.concurrency))
        ref = by_key.get((reference, m.concurrency)) if reference else None
        lat = m.load.latencies_s
        outputs = [r.output_key() for r in m.load.requests]
        match = (exact_matches(outputs, [r.output_key() for r in base.load.requests])
                 if base and compare_outputs else None)
        rows.append({
            "config": m.config,
            "concurrency": m.concurrency,
            "requests": len(m.load.requests),
            "output_tokens": m.load.output_tokens,
            "wall_s": m.load.wall_s,
            "tokens_per_s": m.load.tokens_per_s,
            "tau": m.spec.tau,
            "tokens_per_step": tokens_per_step(m.load.output_tokens, m.spec.accepted) if m.spec.present else None,
            "acceptance_rate": m.spec.acceptance_rate,
            "drafts": m.spec.drafts if m.spec.present else None,
            "draft_tokens": m.spec.draft_tokens if m.spec.present else None,
            "accepted_tokens": m.spec.accepted if m.spec.present else None,
            "accepted_per_pos": {str(k): v for k, v in sorted(m.spec.accepted_per_pos.items())} or None,
            "latency_mean_s": sum(lat) / len(lat) if lat else None,
            "latency_p50_s": percentile(lat, 50),
            "latency_p90_s": percentile(lat, 90),
            "exact_match": match,
            "speedup_vs_off": ratio(m.load.tokens_per_s, base.load.tokens_per_s) if base else None,
            "speedup_vs_ref": ratio(m.load.tokens_per_s, ref.load.tokens_per_s) if ref else None,
            "draft_ms_per_step": m.spec.tree_ms_per_step("treespec_draft_seconds"),
            "verify_ms_per_step": m.spec.tree_ms_per_step("treespec_verify_seconds"),
            "accept_ms_per_step": m.spec.tree_ms_per_step("treespec_accept_seconds"),
            "compaction_ms_per_step": m.spec.tree_ms_per_step("treespec_compaction_seconds"),
            "tree_attention_ms_per_step": m.spec.tree_ms_per_step("treespec_tree_attention_seconds"),
            "worker_step_ms": m.spec.tree_ms_per_step("treespec_worker_step_seconds"),
            "mean_tree_nodes": (m.spec.tree["treespec_tree_nodes_sum"] / m.spec.tree["treespec_tree_nodes_count"]
                                if m.spec.tree.get("treespec_tree_nodes_count") else None),
        })
    return rows


def all_match(rows: Sequence[dict[str, Any]]) -> bool:
    """True when every row with an exact-match entry matched all its outputs."""
    return all(r["exact_match"] is None or r["exact_match"][0] == r["exact_match"][1] for r in rows)
