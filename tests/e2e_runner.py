"""Runs one real vLLM engine (offline `LLM`) in its own process and dumps what it emitted.

Tests start this script once per engine configuration (`run_engine()` in tests/e2e.py), so
each engine gets a fresh process (vLLM spawns workers and does not fully release an engine
in-process). Input and output are JSON files; see `main()` for the job format.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function


def _proposer_state(worker) -> dict:
    """Runs inside the worker: what the TreeProposer still holds."""
    drafter = getattr(worker.model_runner, "drafter", None)
    requests = getattr(drafter, "requests", None)
    return {
        "proposer": type(drafter).__name__ if drafter is not None else None,
        "tracked_requests": None if requests is None else len(requests),
        # every per-request table of the proposer and its drafter: {name: requests held}
        "tables": drafter.tracked_requests() if hasattr(drafter, "tracked_requests") else None,
        "drafted": None if requests is None else sum(s.drafted for s in requests.values()),
        "stats": drafter.stats.summary() if hasattr(drafter, "stats") else None,
        "drafter": getattr(getattr(drafter, "drafter", None), "counters", dict)(),
        "budget": drafter.budget.policy.state() if hasattr(drafter, "budget") else None,
    }


def _settled_proposer_state(llm, timeout_s: float = 20.0) -> list:
    """The proposer state once the engine has told the worker about the last finished requests.

    vLLM hands a worker the ids of requests that finished in step t with step t+1's scheduler
    output. An engine core in its own process runs that flush step on its own, racing this RPC;
    one inside this process steps only when asked, so it is asked once here (the step schedules
    no tokens and only delivers the finished ids). Then poll until no request is tracked (a real
    leak never gets there and the caller's assertions fail)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        llm.llm_engine.step()
    deadline = time.time() + timeout_s
    while True:
        state = llm.collective_rpc(_proposer_state)
        held = [sum((s.get("tables") or {}).values()) + (s.get("tracked_requests") or 0)
                for s in state]
        if not any(held) or time.time() > deadline:
            return state
        time.sleep(0.2)


def _sampling(sp: dict):
    from vllm import SamplingParams

    return SamplingParams(**sp)


def _is_chat(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def _generate(llm, prompts: list, params: list, concurrency: int) -> list:
    """Requests in waves of `concurrency` (0 = all at once; the engine's max_num_seqs bounds it).

    A prompt is text, a list of token ids, or a chat conversation (a list of {"role", "content"}
    messages, rendered by the model's chat template: `LLM.chat`); a wave is all of one kind."""
    from vllm.inputs import TokensPrompt

    def run(batch: list, sps: list) -> list:
        if _is_chat(batch[0]):
            return llm.chat(batch, sps, use_tqdm=False)
        return llm.generate([TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in batch],
                            sps, use_tqdm=False)

    if concurrency <= 0:
        return run(prompts, params)
    outs = []
    for i in range(0, len(prompts), concurrency):
        outs.extend(run(prompts[i:i + concurrency], params[i:i + concurrency]))
    return outs


def _generate_with_aborts(llm, prompts: list, params: list, abort_after_steps: int) -> list:
    """All requests at once through the engine's step loop; every other request (even index) is
    aborted after `abort_after_steps` engine steps, mid-generation. Aborted requests report no
    tokens (how far they got depends on speculation); the others run to completion."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    ids = [f"abort-phase-{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(ids, prompts, params):
        engine.add_request(rid, TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p, sp)
    done: dict = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
        if steps == abort_after_steps:
            engine.abort_request([r for i, r in enumerate(ids) if i % 2 == 0 and r not in done])
    return [done.get(r) for r in ids]


def _metrics(llm) -> dict:
    totals: dict[str, float] = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            totals[m.name] = totals.get(m.name, 0.0) + float(value)
        values = getattr(m, "values", None)
        if m.name.endswith("per_pos") and values is not None:
            totals[m.name] = list(values)
    return totals


def main() -> None:
    job = json.load(open(sys.argv[1]))
    from vllm import LLM

    t0 = time.time()
    llm = LLM(model=job["model"], disable_log_stats=False, **job["engine"])
    startup = time.time() - t0
    result: dict = {"startup_s": startup, "phases": []}
    for phase in job["phases"]:
        prompts = phase["prompts"]
        params = [_sampling(sp) for sp in phase["sampling"]]
        if phase.get("stop_from_probe"):
            # Choose each stop string from this engine's own unconstrained output, so the same
            # deterministic procedure runs with speculation off and on.
            probe = _generate(llm, prompts, params, phase["concurrency"])
            for sp, out in zip(params, probe):
                text = out.outputs[0].text
                a, b = phase["stop_from_probe"]
                sp.stop = [text[a:b]] if len(text) > b and text[a:b].strip() else None
        t = time.time()
        if phase.get("abort_after_steps"):
            outs = _generate_with_aborts(llm, prompts, params, phase["abort_after_steps"])
        else:
            outs = _generate(llm, prompts, params, phase["concurrency"])
        result["phases"].append({
            "name": phase["name"],
            "seconds": time.time() - t,
            "outputs": [
                {"token_ids": [], "text": "", "finish_reason": "aborted", "stop": None,
                 "num_logprobs": None} if o is None or o.outputs[0].finish_reason == "abort" else
                {"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
                 "finish_reason": o.outputs[0].finish_reason,
                 "stop": (params[i].stop or [None])[0],
                "num_logprobs": None if o.outputs[0].logprobs is None else len(o.outputs[0].logprobs)}
                for i, o in enumerate(outs)
            ],
        })
    result["metrics"] = _metrics(llm)
    if job.get("inspect_proposer"):
        result["proposer"] = _settled_proposer_state(llm)
    json.dump(result, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
