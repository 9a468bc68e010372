"""Where a speculative step's time goes: cProfile of an offline `LLM` run (engine in-process) on
the code-LM fixture (or `--fixture NAME --dtype DTYPE --chat`: another fixture, its dtype and
MT-Bench + HumanEval chat requests), 16 held-out prompts x 128 tokens at concurrency 1, greedy.

    .venv/bin/python benchmarks/profile_offline.py demo/lookup-trie-tree 8            # treespec preset, K
    .venv/bin/python benchmarks/profile_offline.py ngram 16                      # vLLM's ngram, K
    .venv/bin/python benchmarks/profile_offline.py off
    .venv/bin/python benchmarks/profile_offline.py prompt-lookup-tree 16 --no-profile   # 3 timed passes
    .venv/bin/python benchmarks/profile_offline.py demo/lookup-trie-tree 8 --dump /tmp/ltt8.prof  # keep the stats
    .venv/bin/python benchmarks/profile_offline.py '{"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}}' 16   # inline config
    .venv/bin/python benchmarks/profile_offline.py demo/lookup-trie-distilled 32 --temperature 0.7  # sampled, seeded
    .venv/bin/python benchmarks/profile_offline.py lookup-online 24 --temperature 0.7 --unseeded  # sampled, no seed
    .venv/bin/python benchmarks/profile_offline.py lookup-online 24 --temperature 0.7 --unseeded --concurrency 32
        # 64 prompts submitted 32 at a time (the engine batches them)
    .venv/bin/python benchmarks/profile_offline.py lookup-online 24 --fixture smollm2-135m --dtype bfloat16 \
        --chat --concurrency 8                                   # the real target, served dtype

Prints tokens/s and the treespec / model functions by cumulative time (ms per engine step is
cumulative / steps); with --no-profile, tokens/s and process CPU seconds of 3 passes
(`--passes N`: N passes either way, e.g. for a longer py-spy sample).
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine in this process: one profile


def main(argv: list[str]) -> int:
    import cProfile
    import pstats

    from vllm import LLM, SamplingParams

    from harness.comparison import ngram_engine_kwargs, treespec_engine_kwargs, treespec_value
    from treespec_fixtures import build_fixture
    from vllm_treespec.train.corpus import held_out_prompts

    mode, profile = argv[0], "--no-profile" not in argv
    k = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 8
    kw: dict = {}
    if mode == "ngram":
        kw = ngram_engine_kwargs(k)
    elif mode != "off":                                         # preset, YAML path or inline JSON
        kw = treespec_engine_kwargs(k, treespec_value(mode))
    from treespec_fixtures.prebuild import prebuild_engine_fixtures

    fixture = argv[argv.index("--fixture") + 1] if "--fixture" in argv else "code-lm"
    dtype = argv[argv.index("--dtype") + 1] if "--dtype" in argv else "float32"
    model = str(build_fixture(fixture))
    prebuild_engine_fixtures(kw, model)                         # on every core, not in the pinned worker
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0, **kw)
    concurrency = int(argv[argv.index("--concurrency") + 1]) if "--concurrency" in argv else 1
    num_prompts = 16 if concurrency == 1 else 2 * concurrency
    if "--chat" in argv:                                        # MT-Bench + HumanEval, chat template
        from bench_paired import paired_prompts
        prompts = paired_prompts(num_prompts, unseen=False, chat_model=model)
    else:
        prompts = held_out_prompts(num_prompts, seed=0)
    temperature = float(argv[argv.index("--temperature") + 1]) if "--temperature" in argv else 0.0
    params = SamplingParams(temperature=temperature, seed=0 if temperature > 0 and "--unseeded" not in argv else None,
                            max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:2], params, use_tqdm=False)          # warm-up
    prof = cProfile.Profile()
    passes = int(argv[argv.index("--passes") + 1]) if "--passes" in argv else (1 if profile else 3)
    for _ in range(passes):
        start, cpu = time.perf_counter(), time.process_time()
        if profile:
            prof.enable()
        for i in range(0, num_prompts, concurrency):
            llm.generate(prompts[i:i + concurrency], params, use_tqdm=False)
        if profile:
            prof.disable()
        wall = time.perf_counter() - start
        print(f"{mode} K={k}: {num_prompts * 128 / wall:.1f} tok/s, {time.process_time() - cpu:.2f} CPU s", flush=True)
    if profile:
        if "--dump" in argv:                                    # raw stats for pstats / snakeviz
            prof.dump_stats(argv[argv.index("--dump") + 1])
        stats = pstats.Stats(prof)
        rows = [(ct, f"{f.split('site-packages/')[-1].split('vllm_treespec/')[-1]}:{line}({fn})", n)
                for (f, line, fn), (_, n, _, ct, _) in stats.stats.items()
                if "vllm_treespec" in f or fn in ("_model_forward", "schedule", "execute_model")]
        for ct, name, n in sorted(rows, reverse=True)[:30]:
            print(f"{1e3 * ct:9.1f} ms cumulative  {n:6d} calls  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
