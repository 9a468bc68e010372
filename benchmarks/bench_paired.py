"""Paired comparison of two engine configs at one client, robust to this VM's speed drift.

Serving sweeps run one config after another, and the 2-core dev VM's speed drifts by tens of
percent over minutes (`bench_serving_min_path_prob_code-lm.json`: rounds of one config 51%
apart), which is more than the differences being measured. Here two offline engines, one per
config, live in two processes (each engine in-process, `VLLM_ENABLE_V1_MULTIPROCESSING=0`) and
take turns prompt by prompt, alternating which goes first; only one computes at a time (the
other blocks on its pipe). Each prompt is timed in both, so drift hits both sides of every pair
and the ratio of summed times is the paired speedup. Greedy outputs are compared pair by pair.

    .venv/bin/python benchmarks/bench_paired.py                      # vLLM ngram K=12 vs lookup-trie K=16
    .venv/bin/python benchmarks/bench_paired.py --a ngram:16 --b demo/lookup-trie-tree:8 --passes 3
    .venv/bin/python benchmarks/bench_paired.py --a vllm-draft:4 \
        --b '{"drafter": {"type": "draft_model", "path": "fixture:draft-lm"}, "tree": {"builder": "chain", "max_depth": 4}}:4'
    .venv/bin/python benchmarks/bench_paired.py --b '{"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}}:16'

A config is `off`, `ngram:K` (vLLM's ngram, n-gram range 1..4), `vllm-draft:K` (vLLM's own
linear `draft_model` method with the draft-LM fixture) or `TREESPEC:K`, TREESPEC being
a preset name, a YAML path or an inline JSON mapping (the `treespec` value of additional_config).
With --concurrency N each turn submits N prompts together (the engine batches them, as with N
clients arriving at once) and a pair is one such batch on each side: the engine's own throughput
at that batch size, without the OpenAI server and the client that share the two cores in
`bench_matrix.py` (whose identical servers read 0.65-1.06x of each other per cell, where this
reads within 1%: docs/never-slower.md section 4). --unseen takes the prompts from
benchmarks/unseen_prompts.py (third-party function heads) instead of the held-out stdlib text;
--chat takes MT-Bench and HumanEval chat requests (benchmarks/chat_prompts.py) rendered with the
model's chat template, for a target that has one (smollm2-135m; every answer still runs to
--max-tokens, past its end of turn, so both sides verify the same lengths). --dtype bfloat16 runs the engines
in the dtype the servers use (default float32: greedy outputs then compare exactly).

    .venv/bin/python benchmarks/bench_paired.py --fixture smollm2-135m --chat --dtype bfloat16 \
        --a off --b lookup-online:24 --concurrency 8 --num-prompts 32 --passes 2

Engine steps are counted per turn (prefill included), so the record
splits the speedup into tokens per step and milliseconds per step, and the step into the
target model's forward and the rest (scheduling, drafting, verification); forward calls are
also binned by their query rows (what each extra verified row costs). Writes a JSON record
(per-prompt seconds and steps of both sides included) with --output.

Drift correction. The VM's speed moves each pair's ratio by up to +-30% (a turn run while the
host is busy is slow throughout), and the two sides' forward times move with it, although
both run the same model on the same rows when neither drafts. `drift_corrected_ratio` divides
each side's time by its own forward time before taking the ratio: what is left is each
config's work outside the forward per unit of forward, with the VM's speed cancelled. Its
A/A pairs (`off` against `off`) read 0.995-1.006 where the raw ratio read 1.007-1.027, with a
per-pair spread of about 1% instead of 10-20% (docs/never-slower.md section 4). It is
meaningful where both sides verify about the same rows (sampled cells in which the default
drafts nothing: equal tokens per step); there, a config's few extra rows (probes) count as VM
speed and flatter it by their share of the forward (see `*_forward_by_rows`), and a config's
own work inside the forward (an attention wrapper) counts as VM speed too, so a change that
removes such work reads worse, not better: judge those by the raw ratio. Where one side
verifies many more rows (greedy speculation), it measures overhead per forward, not speedup.

A treespec spec may end in `@plain-floor`: every step without scheduled drafts is then sampled as
vLLM's plain step with none of the proposer's work (no quiet-stretch check, decision, drafting or
bookkeeping; nobody ever drafts). Paired with the same spec without it, that prices the
proposer's own per-step work on a sampled load apart from the plain-step path around it:
    .venv/bin/python benchmarks/bench_paired.py --a lookup-online:24@plain-floor --b lookup-online:24 \
        --temperature 0.7 --unseeded --unseen --num-prompts 32 --passes 3

With --temperature T > 0 every request samples (seeded per prompt and pass, the same seeds on
both sides; --unseeded sends no seed, as served traffic mostly does: treespec then has no
per-request stream to keep, see engine/plain_sampling.py). Speculation keeps the target's distribution, not its random stream, so outputs are
not compared pair by pair then; `tests/test_e2e_tree_sampling.py` tests the distribution.
    .venv/bin/python benchmarks/bench_paired.py --a off --b demo/lookup-trie-distilled:32 --temperature 0.7
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


VLLM_DRAFT = "fixture:draft-lm"     # the drafter of `vllm-draft:K` (the treespec draft-model preset's)


PLAIN_FLOOR = "@plain-floor"


def base_spec(spec: str) -> str:
    """The config spec without its `@plain-floor` variant (module docstring)."""
    return spec.removesuffix(PLAIN_FLOOR)


def engine_kwargs(spec: str) -> dict[str, Any]:
    """LLM(...) keyword arguments of one config spec (see the module docstring)."""
    if spec.endswith(PLAIN_FLOOR):
        kwargs = engine_kwargs(base_spec(spec))
        if "treespec" not in kwargs.get("additional_config", {}):
            raise ValueError(f"config {spec!r}: {PLAIN_FLOOR} applies to treespec configs only")
        return kwargs
    if spec == "off":
        return {}
    name, sep, k = spec.rpartition(":")
    if not sep or not k.isdigit() or not name:
        raise ValueError(f"config {spec!r}: expected off, ngram:K, vllm-draft:K or TREESPEC:K "
                         "(K a positive integer)")
    from harness.comparison import (ngram_engine_kwargs, treespec_engine_kwargs, treespec_value,
                                          vllm_draft_engine_kwargs)

    if name == "ngram":
        return ngram_engine_kwargs(int(k))
    if name == "vllm-draft":                # the path is resolved (built) in main(), not here
        return vllm_draft_engine_kwargs(int(k), VLLM_DRAFT)
    return treespec_engine_kwargs(int(k), treespec_value(name))


def check_spec(spec: str) -> None:
    """Raise ValueError for a bad spec, including a treespec config that would not load: the
    engine processes would otherwise fail one by one after the fixtures are built."""
    kwargs = engine_kwargs(spec)
    treespec = kwargs.get("additional_config", {}).get("treespec")
    if treespec is not None:
        from vllm_treespec.config import load_config

        load_config(treespec, kwargs["speculative_config"]["num_speculative_tokens"])


def resolved(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with a `fixture:NAME` draft model of vLLM's own draft_model method built and
    replaced by its directory (vLLM itself only reads directories)."""
    spec = kwargs.get("speculative_config", {})
    if spec.get("method") != "draft_model":
        return kwargs
    from vllm_treespec.drafters.lm.loading import resolve_model_dir

    return {**kwargs, "speculative_config": {**spec, "model": str(resolve_model_dir(spec["model"]))}}


def _plain_floor() -> None:
    """`@plain-floor` (module docstring): every plain step is taken as a quiet one, and a quiet
    step does nothing but mark the step undrafted."""
    from vllm_treespec.engine.proposer import TreeProposer

    def take_quiet_step(self: Any, sampled_token_ids: Any) -> None:
        self.drafted = False
        self.step_started_at = None

    TreeProposer.takes_quiet_step = lambda self, runner, scheduler_output: self.plain_step
    TreeProposer.take_quiet_step = take_quiet_step


def _serve(conn: Any, kwargs: dict[str, Any], model: str, max_tokens: int, temperature: float,
           seeded: bool = True, plain_floor: bool = False, dtype: str = "float32") -> None:
    """Child process: one engine; answers (prompts, seeds) with (seconds, token ids per prompt,
    steps, forward seconds) until None. The prompts of one request are submitted together."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    if plain_floor:
        _plain_floor()

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0,
              **kwargs)
    engine, steps, forward = llm.llm_engine, [0], [0.0]
    by_rows: dict[int, list[float]] = {}    # forward calls by query rows: [count, seconds]
    measuring = [False]                     # set once both sides are warm
    engine_step = engine.step

    def counted_step() -> Any:              # one call = one engine step (prefill or decode)
        steps[0] += 1
        return engine_step()

    engine.step = counted_step
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    model_forward = GPUModelRunner._model_forward

    def timed_forward(self: Any, input_ids: Any = None, positions: Any = None, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()             # the target model's forward
        try:
            return model_forward(self, input_ids, positions, *args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            forward[0] += seconds
            if measuring[0]:
                entry = by_rows.setdefault(int(positions.shape[0]) if positions is not None else -1, [0, 0.0])
                entry[0] += 1
                entry[1] += seconds

    GPUModelRunner._model_forward = timed_forward
    conn.send("ready")
    while (request := conn.recv()) is not None:
        if request == "measure":                # warm-up done: count forwards by rows from now on
            measuring[0] = True
            continue
        batch, seeds = request
        params = [SamplingParams(temperature=temperature, seed=seed if temperature > 0 and seeded else None,
                                 max_tokens=max_tokens, ignore_eos=True) for seed in seeds]
        steps[0], forward[0] = 0, 0.0
        start = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        conn.send((time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs], steps[0],
                   forward[0]))
    conn.send({rows: (n, seconds) for rows, (n, seconds) in sorted(by_rows.items())})


def _receive(side: tuple[Any, Any, str]) -> Any:
    """The next message of one engine process; a clear error (not a hang) when it has died."""
    conn, proc, spec = side
    try:
        return conn.recv()
    except EOFError:
        proc.join(timeout=10)
        raise RuntimeError(f"engine for {spec!r} exited (code {proc.exitcode}); its error is above") from None


def drift_corrected(pairs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(summed, per-pair median) B/A with each turn's seconds divided by its forward seconds
    (module docstring); None where a record has no forward times."""
    fa, fb = sum(x.get("a_forward_s", 0.0) for x in pairs), sum(x.get("b_forward_s", 0.0) for x in pairs)
    per_pair = [(x["a_s"] / x["a_forward_s"]) / (x["b_s"] / x["b_forward_s"])
                for x in pairs if x.get("a_forward_s", 0.0) > 0 and x.get("b_forward_s", 0.0) > 0]
    if not (fa > 0 and fb > 0 and per_pair):
        return None, None
    ta, tb = sum(x["a_s"] for x in pairs), sum(x["b_s"] for x in pairs)
    return (ta / fa) / (tb / fb), statistics.median(per_pair)


def paired_prompts(num_prompts: int, unseen: bool, chat_model: str | None = None) -> list[str]:
    """The prompts of a paired run: third-party function heads (benchmarks/unseen_prompts.py),
    MT-Bench + HumanEval chat requests rendered with `chat_model`'s chat template (as the
    OpenAI server renders them), or the fixtures' held-out stdlib text; seed 0 each way."""
    if chat_model is not None:
        from chat_prompts import chat_pool
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(chat_model)
        return [tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
                for p in chat_pool(0)[:num_prompts]]
    if unseen:
        from unseen_prompts import build_prompts

        return [p.text for p in build_prompts(num_prompts, seed=0)]
    from vllm_treespec.train.corpus import held_out_prompts

    return held_out_prompts(num_prompts, seed=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default="ngram:12", help="reference config (default: vLLM ngram K=12)")
    p.add_argument("--b", default='{"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_path_prob": 0.01}, '
                                  '"tree": {"builder": "chain", "max_depth": 16}}:16',
                   help="compared config (default: lookup-trie chain, floor 0.01, K=16)")
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=2, help="times each prompt is run on each side")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every request (> 0: seeded, outputs not compared)")
    p.add_argument("--unseeded", action="store_true", help="sampled requests carry no seed")
    p.add_argument("--concurrency", type=int, default=1,
                   help="prompts submitted together in each turn (the engine batches them, as with "
                        "that many clients arriving at once); a pair is one such batch on each side")
    p.add_argument("--unseen", action="store_true",
                   help="prompts from benchmarks/unseen_prompts.py (function heads of third-party "
                        "packages) instead of the fixtures' held-out stdlib text")
    p.add_argument("--chat", action="store_true",
                   help="MT-Bench + HumanEval chat requests in the model's chat template")
    p.add_argument("--dtype", default="float32", help="engine dtype (servers use the model's, bfloat16)")
    p.add_argument("--output", type=Path, default=None, help="JSON record path")
    ns = p.parse_args(argv)
    for spec in (ns.a, ns.b):
        try:
            check_spec(spec)
        except (ValueError, json.JSONDecodeError) as e:    # ConfigError is a ValueError
            p.error(str(e))
    if ns.concurrency < 1:
        p.error(f"--concurrency must be at least 1, got {ns.concurrency}")
    if ns.passes < 1:
        p.error(f"--passes must be at least 1, got {ns.passes}")
    if ns.temperature < 0:
        p.error(f"--temperature must be >= 0 (0 = greedy), got {ns.temperature}")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    from treespec_fixtures import build_fixture
    from treespec_fixtures.prebuild import prebuild_engine_fixtures

    model = str(build_fixture(ns.fixture))
    for spec in (ns.a, ns.b):               # here, on every core, not in a core-pinned worker
        prebuild_engine_fixtures(engine_kwargs(spec), model)
    prompts = paired_prompts(ns.num_prompts, ns.unseen, model if ns.chat else None)
    n = ns.concurrency
    batches = [prompts[i:i + n] for i in range(0, len(prompts), n)]
    ctx = mp.get_context("spawn")
    sides = []
    for spec in (ns.a, ns.b):               # started one after the other: never two warm-ups at once
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, resolved(engine_kwargs(spec)), model, ns.max_tokens,
                                                     ns.temperature, not ns.unseeded, spec.endswith(PLAIN_FLOOR),
                                                     ns.dtype),
                           daemon=True)
        proc.start()
        child.close()                       # the child's end lives in the child: its exit means EOF here
        sides.append((parent, proc, spec))
        if _receive(sides[-1]) != "ready":
            raise RuntimeError(f"engine for {spec!r} did not start")

    def run(side: int, batch: list[str], seeds: list[int]) -> tuple[float, list[list[int]], int, float]:
        sides[side][0].send((batch, seeds))
        return _receive(sides[side])

    for b in batches[:2]:                   # warm-up, both sides
        run(0, b, [0] * len(b)), run(1, b, [0] * len(b))
    for conn, _, _ in sides:
        conn.send("measure")
    pairs, mismatches, outputs = [], 0, 0
    for i in range(ns.passes * len(batches)):
        k = i % len(batches)
        batch, seeds = batches[k], [i * n + j for j in range(len(batches[k]))]
        first = i % 2
        got = {first: run(first, batch, seeds)}
        got[1 - first] = run(1 - first, batch, seeds)
        mismatches += sum(x != y for x, y in zip(got[0][1], got[1][1]))
        outputs += len(batch)
        pairs.append({"prompt": k * n, "prompts": len(batch), "a_s": got[0][0], "b_s": got[1][0],
                      "a_first": first == 0, "a_steps": got[0][2], "b_steps": got[1][2],
                      "a_forward_s": got[0][3], "b_forward_s": got[1][3]})
    forward_by_rows = []
    for side in sides:
        side[0].send(None)
        forward_by_rows.append(_receive(side))
        side[1].join(timeout=60)
    ta, tb = sum(x["a_s"] for x in pairs), sum(x["b_s"] for x in pairs)
    tokens = ns.max_tokens * outputs
    per_pair = [x["a_s"] / x["b_s"] for x in pairs]
    sa, sb = sum(x["a_steps"] for x in pairs), sum(x["b_steps"] for x in pairs)
    fa, fb = sum(x["a_forward_s"] for x in pairs), sum(x["b_forward_s"] for x in pairs)
    result = {"a": ns.a, "b": ns.b, "a_tokens_per_s": tokens / ta, "b_tokens_per_s": tokens / tb,
              "speedup_b_over_a": ta / tb, "pair_ratio_median": statistics.median(per_pair),
              "pair_ratio_min": min(per_pair), "pair_ratio_max": max(per_pair),
              # speedup = (tokens per step ratio) x (step time ratio): which of the two moved
              "a_tokens_per_step": tokens / sa, "b_tokens_per_step": tokens / sb,
              "a_ms_per_step": 1e3 * ta / sa, "b_ms_per_step": 1e3 * tb / sb,
              # of which the target model's forward; the rest is scheduling, drafting, sampling
              "a_forward_ms_per_step": 1e3 * fa / sa, "b_forward_ms_per_step": 1e3 * fb / sb,
              # forward calls by query rows (1 = a step without drafts; large = prefills):
              # {rows: [calls, mean ms]}
              "a_forward_by_rows": {r: [n, 1e3 * t / n] for r, (n, t) in forward_by_rows[0].items()},
              "b_forward_by_rows": {r: [n, 1e3 * t / n] for r, (n, t) in forward_by_rows[1].items()},
              # the same ratio with each turn's time divided by its own forward time: the
              # forward as the yardstick of the VM's speed in that turn (module docstring)
              **dict(zip(("drift_corrected_ratio", "drift_corrected_pair_median"), drift_corrected(pairs))),
              "temperature": ns.temperature, "seeded": ns.temperature > 0 and not ns.unseeded,
              # greedy: must be equal; sampled: counted for information (see the module docstring)
              "outputs_equal": mismatches == 0, "mismatched_pairs": mismatches}
    for side, spec in (("a", ns.a), ("b", ns.b)):
        print(f"{side.upper()} {spec}: {result[side + '_tokens_per_s']:.1f} tok/s, "
              f"{result[side + '_tokens_per_step']:.2f} tok/step, {result[side + '_ms_per_step']:.2f} ms/step "
              f"(forward {result[side + '_forward_ms_per_step']:.2f})")
    print(
          f"B/A = {result['speedup_b_over_a']:.3f} (per-pair median {result['pair_ratio_median']:.3f}, "
          f"range {result['pair_ratio_min']:.2f}-{result['pair_ratio_max']:.2f}); "
          f"{'greedy' if ns.temperature == 0 else 'sampled'} outputs equal in {outputs - mismatches}/{outputs}")
    if result["drift_corrected_ratio"] is not None:
        print(f"drift-corrected B/A = {result['drift_corrected_ratio']:.3f} "
              f"(per-pair median {result['drift_corrected_pair_median']:.3f}); meaningful where both "
              "sides verify the same rows (see the module docstring)")
    if ns.output is not None:
        from harness.report import git_commit, hardware_info, software_info

        ns.output.write_text(json.dumps({"benchmark": "bench_paired", "hardware": hardware_info(),
                                         "software": software_info(), "commit": git_commit(),
                                         "fixture": ns.fixture, "prompts": ns.num_prompts,
                                         "concurrency": ns.concurrency, "unseen_prompts": ns.unseen,
                                         "chat_prompts": ns.chat, "dtype": ns.dtype,
                                         "max_tokens": ns.max_tokens, "passes": ns.passes,
                                         **result, "pairs": pairs}, indent=1))
        print(f"wrote {ns.output}")
    return 0 if mismatches == 0 or ns.temperature > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
