"""The proposer's per-step time for a batch of idle sampled requests, without an engine.

Why: at sampled loads the default drafts nothing, and what it still costs per step is the
proposer's bookkeeping over every request in the batch (docs/never-slower.md section 1). This
times the proposer's part of each step on a fake runner whose N requests are all stopped and
waiting for their probe (the common sampled state), as the runner patches call it (a step of a
quiet stretch is `take_quiet_step`, any other `propose_step`), in-process and hot, so it
isolates treespec's Python from vLLM and the model.

    .venv/bin/python benchmarks/bench_propose_step.py --requests 32 \
        --output benchmarks/results/bench_propose_step_c32.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _vllm_config(k: int, preset: str) -> SimpleNamespace:
    """The fields of vLLM's config that TreeProposer reads."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        additional_config={"treespec": preset},
        model_config=SimpleNamespace(max_model_len=1024, tokenizer=None, get_vocab_size=lambda: 4096),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=64),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--preset", default="lookup-online")
    ap.add_argument("-k", type=int, default=24)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", type=Path, default=None)
    ns = ap.parse_args(argv)

    from vllm import SamplingParams

    from harness.report import hardware_info, software_info
    from vllm_treespec.engine.proposer import TreeProposer

    n = ns.requests
    proposer = TreeProposer(_vllm_config(ns.k, ns.preset))
    ids = [f"r{i}" for i in range(n)]
    tokens = np.random.default_rng(0).integers(1, 4000, size=(n, 512)).astype(np.int32)
    batch = SimpleNamespace(req_ids=ids, token_ids_cpu=tokens, num_tokens_no_spec=np.full(n, 300, dtype=np.int32))
    runner = SimpleNamespace(input_batch=batch, requests={
        r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.7, max_tokens=128),
                           output_token_ids=[1] * 10, num_prompt_tokens=290) for r in ids})
    sched = SimpleNamespace(num_spec_tokens_to_schedule=0, finished_req_ids=set(), scheduled_spec_decode_tokens={},
                            num_scheduled_tokens=dict.fromkeys(ids, 1), total_num_scheduled_tokens=n)
    sampled = [[5]] * n
    proposer.propose_step(runner, sched, sampled)               # the requests' records are made
    per_step = []
    for _ in range(ns.repeats):
        for r in ids:                                           # stopped, the probe far away
            record = proposer.requests[r].gain
            record.waited, record.interval, record.probed = 0, 10 ** 6, False
        start = time.perf_counter()
        for _ in range(ns.steps):
            proposer.step_started_at = time.perf_counter()
            proposer.plain_step = True                          # (set by the `_prepare_inputs` patch)
            if proposer.takes_quiet_step(runner, sched):        # as the `sample_tokens` patch does
                proposer.take_quiet_step(sampled)
            else:
                proposer.propose_step(runner, sched, sampled)
        per_step.append(1e6 * (time.perf_counter() - start) / ns.steps)
    record = {"benchmark": "bench_propose_step", "hardware": hardware_info(), "software": software_info(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
              "us_per_step": per_step, "us_per_step_median": statistics.median(per_step)}
    print(f"propose_step, {n} waiting sampled requests: {record['us_per_step_median']:.1f} us per step "
          f"(median of {ns.repeats}: {', '.join(f'{x:.1f}' for x in per_step)})")
    if ns.output:
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
