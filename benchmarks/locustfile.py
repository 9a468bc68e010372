"""Load test of an OpenAI-compatible vLLM server (treespec on or off) with locust.

    locust -f benchmarks/locustfile.py --host http://127.0.0.1:8000
    locust -f benchmarks/locustfile.py --host URL --headless -u 16 -r 16 --run-time 60s --csv out/run

Each simulated user sends, back to back, a mix of OpenAI completions and chat completions,
streaming and non-streaming, with prompts drawn from a mixed set: code (held-out Python
standard-library sources, the code-LM fixture's own domain) and chat-like text (questions and
instructions of varied length). The served model's name comes from `/v1/models`; chat requests
need a chat template on the server (`--chat-template`; `benchmarks/load_sweep.py` passes
`benchmarks/chat_template.jinja` for models without one).

Recorded per request (besides locust's own latency stats): time to first token (TTFT, streaming
requests: first chunk with text) and time per output token (TPOT: (end - first token) / (tokens -
1), streaming; non-streaming requests report end-to-end latency / tokens as `tpot_e2e`). They go
to locust's statistics as request types `TTFT` / `TPOT` (so `--csv` has their percentiles) and,
with `TREESPEC_LOCUST_LOG=path.jsonl`, one JSON line per request (what `load_sweep.py` reads for
throughput in output tokens per second).

Environment knobs (all optional):
    TREESPEC_LOCUST_MAX_TOKENS   "32,64,128" (pick uniformly) or "16-128" (uniform range); default 16-128
    TREESPEC_LOCUST_MIX          weights completion,completion_stream,chat,chat_stream; default 1,1,1,1
    TREESPEC_LOCUST_TEMPERATURE  sampling temperature; default 0 (greedy)
    TREESPEC_LOCUST_SEED         prompt / length choice seed; default 0
    TREESPEC_LOCUST_LOG          JSONL path for per-request records; default none
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

from locust import HttpUser, events, task

CHAT_LIKE = [
    "What is the difference between a list and a tuple in Python?",
    "Explain recursion to a new programmer in two sentences.",
    "Write a short note to a colleague asking to move tomorrow's meeting to the afternoon.",
    "Summarise the main idea of speculative decoding for a non-expert.",
    "Give three tips for writing readable functions.",
    "How do I read a CSV file and sum one of its columns?",
    "Describe what a hash table is and when you would use one.",
    "I keep getting a KeyError when I look up a dictionary. What should I check first?",
    "Suggest a name for a command-line tool that renames photos by date.",
    "Why is my loop slow when I append to a string inside it?",
    "Compare threads and processes in one paragraph.",
    "Translate this comment into plain English: # guard against re-entrant calls",
]


def _max_tokens_sampler(spec: str, rng: random.Random):
    """A callable giving each request's max_tokens: "a,b,c" picks one, "lo-hi" is uniform."""
    spec = spec.strip()
    if "-" in spec and "," not in spec:
        try:
            lo, hi = (int(x) for x in spec.split("-", 1))
        except ValueError:
            lo, hi = 0, -1
        if not 1 <= lo <= hi:
            raise ValueError(f"TREESPEC_LOCUST_MAX_TOKENS={spec!r}: need 1 <= lo <= hi, e.g. 16-128")
        return lambda: rng.randint(lo, hi)
    try:
        choices = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        choices = []
    if not choices or min(choices) < 1:
        raise ValueError(f"TREESPEC_LOCUST_MAX_TOKENS={spec!r}: give positive integers, e.g. 32,64,128")
    return lambda: rng.choice(choices)


def load_prompts(seed: int) -> list[tuple[str, str]]:
    """(kind, text) prompts: held-out stdlib code (when the fixture corpus is importable) and
    chat-like questions, plus docstring questions built from the same code."""
    prompts = [("chat", q) for q in CHAT_LIKE]
    try:
        from vllm_treespec.train.corpus import held_out_prompts
    except ImportError:
        return prompts
    for n, chars in ((12, 200), (12, 600), (6, 1500)):
        prompts += [("code", p) for p in held_out_prompts(n, prompt_chars=chars, seed=seed + chars)]
    for p in held_out_prompts(8, prompt_chars=300, seed=seed + 7):
        prompts.append(("chat", "What does this code do?\n\n" + p))
    return prompts


class _Log:
    """Thread-safe JSONL writer for per-request records (locust users share one process)."""

    def __init__(self, path: str | None) -> None:
        self.lock = threading.Lock()
        self.fh = open(path, "a", buffering=1) if path else None

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is not None:
            with self.lock:
                self.fh.write(json.dumps(record) + "\n")


SEED = int(os.environ.get("TREESPEC_LOCUST_SEED", "0"))
_RNG = random.Random(SEED)
PROMPTS = load_prompts(SEED)
MAX_TOKENS = _max_tokens_sampler(os.environ.get("TREESPEC_LOCUST_MAX_TOKENS", "16-128"), _RNG)
MIX = [float(x) for x in os.environ.get("TREESPEC_LOCUST_MIX", "1,1,1,1").split(",")]
TEMPERATURE = float(os.environ.get("TREESPEC_LOCUST_TEMPERATURE", "0"))
LOG = _Log(os.environ.get("TREESPEC_LOCUST_LOG"))
if len(MIX) != 4 or min(MIX) < 0 or sum(MIX) <= 0:
    raise ValueError("TREESPEC_LOCUST_MIX: four non-negative weights completion,completion_stream,chat,"
                     "chat_stream with a positive sum, e.g. 1,1,1,1")


def _fire(environment: Any, kind: str, name: str, ms: float) -> None:
    environment.events.request.fire(request_type=kind, name=name, response_time=ms, response_length=0,
                                    exception=None, context={})


class OpenAIUser(HttpUser):
    """One client sending requests back to back (no think time: load = number of users)."""

    def on_start(self) -> None:
        with self.client.get("/v1/models", name="/v1/models", catch_response=True) as r:
            data = r.json().get("data") if r.status_code == 200 else None
            if not data:
                r.failure(f"/v1/models returned {r.status_code}: {r.text[:200]}")
                raise RuntimeError("no model served at /v1/models")
            self.model = data[0]["id"]

    @task
    def one_request(self) -> None:
        chat, stream = {0: (False, False), 1: (False, True), 2: (True, False),
                        3: (True, True)}[_RNG.choices(range(4), weights=MIX)[0]]
        kind, prompt = _RNG.choice(PROMPTS)
        body: dict[str, Any] = {"model": self.model, "max_tokens": MAX_TOKENS(), "temperature": TEMPERATURE,
                                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        else:
            path, body["prompt"] = "/v1/completions", prompt
        name = f"{'chat' if chat else 'completion'}{' stream' if stream else ''}"
        start = time.perf_counter()
        first = None
        tokens = 0
        with self.client.post(path, json=body, stream=stream, name=name, catch_response=True) as r:
            if r.status_code != 200:
                # status 0: no response at all; requests' exception says why (refused, reset, ...)
                error = repr(getattr(r, "error", None)) if r.status_code == 0 else (r.text or "")[:300]
                r.failure(f"HTTP {r.status_code}: {error}")
                LOG.write({"name": name, "ok": False, "status": r.status_code, "start": start,
                           "end": time.perf_counter(), "error": error})
                return
            try:
                if stream:
                    for line in r.iter_lines():
                        if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        choices = chunk.get("choices") or []
                        text = ""
                        if choices:
                            text = choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or ""
                        if text and first is None:
                            first = time.perf_counter()
                        if chunk.get("usage"):
                            tokens = int(chunk["usage"]["completion_tokens"])
                else:
                    tokens = int(r.json()["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError) as e:
                r.failure(f"unreadable response: {e}")
                LOG.write({"name": name, "ok": False, "status": r.status_code, "start": start})
                return
        end = time.perf_counter()
        record = {"name": name, "ok": True, "kind": kind, "max_tokens": body["max_tokens"], "tokens": tokens,
                  "start": start, "end": end, "latency_s": end - start}
        if first is not None:
            record["ttft_s"] = first - start
            _fire(self.environment, "TTFT", name, 1e3 * (first - start))
            if tokens > 1:
                record["tpot_s"] = (end - first) / (tokens - 1)
                _fire(self.environment, "TPOT", name, 1e3 * record["tpot_s"])
        elif tokens > 0:
            record["tpot_e2e_s"] = (end - start) / tokens
        LOG.write(record)


@events.quitting.add_listener
def _close_log(environment: Any, **_: Any) -> None:
    if LOG.fh is not None:
        LOG.fh.close()
