"""Soak run: a treespec server under mixed, misbehaving load for a bounded time.

One server (default: the default preset, prompt-lookup, which an operator switches on blind)
takes, for --minutes:
- --users closed-loop clients sending completions of mixed sizes (max_tokens 8..256, prompts of
  200..1500 characters), a share streaming;
- cancellations: streaming requests the client drops after a few chunks (disconnects);
- bursts: every --burst-every seconds, --burst-size extra requests at once, above max_num_seqs;
- long prompts whose prompt + max_tokens reach max_model_len (trimmed with /tokenize);
- spot checks: fixed greedy prompts whose outputs must equal the same prompts served with
  speculation off (recorded first, on a server without speculation).
A monitor samples every process's RSS in the server's process group every --sample-s seconds
(the API server, the engine core, and the worker, which holds the proposer and its per-request
tables: `VLLM::Worker`, or the engine core when it runs the worker inline) and whether the server
is alive. Recorded: requests by kind, HTTP 5xx and other errors, crashes, RSS over time and its
growth after the warm-up, spot-check mismatches. JSON (+ PNG of RSS) to benchmarks/results/.

    .venv/bin/python benchmarks/soak.py --minutes 10 --users 16
    .venv/bin/python benchmarks/soak.py --minutes 1 --users 4 --output /tmp/soak.json   # a smoke run

Pass criteria printed at the end: 0 server errors, 0 crashes, every spot check equal, the
worker's RSS growth after warm-up below --max-worker-growth (default 1%) and the
whole group's below 5%. Growth = the largest sample of the second half of the post-warm-up window
over the mean of its first three samples.
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MAX_MODEL_LEN = 1024


def _post(base: str, path: str, body: dict, timeout: float = 600.0) -> tuple[int, dict | None]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, None


def process_rss_mb(pgid: int) -> dict[str, float]:
    """Resident memory of each process in the server's process group (API server, engine core,
    workers), in MiB by "pid:name", from /proc (vLLM titles its engine core `VLLM::EngineCore`)."""
    out: dict[str, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/statm") as fh:
                rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                name = fh.read().split(b"\0")[0].decode(errors="replace").rsplit("/", 1)[-1]
        except (OSError, ProcessLookupError, ValueError):
            continue
        out[f"{pid}:{name}"] = rss / 2**20
    return out


def worker_rss_mb(per_process: dict[str, float]) -> float | None:
    """RSS of the process that runs the model worker (the proposer and its tables): vLLM's
    `VLLM::Worker` when the executor spawns one, else the engine core that runs it inline."""
    for title in ("Worker", "EngineCore"):
        found = [v for k, v in per_process.items() if title in k]
        if found:
            return max(found)
    return None


def group_rss_mb(pgid: int) -> float:
    """Resident memory of the whole process group, in MiB."""
    return sum(process_rss_mb(pgid).values())


def growth(values: list[float]) -> float | None:
    """Largest value of the second half over the mean of the first three (None: too few)."""
    if len(values) < 6:
        return None
    return max(values[len(values) // 2:]) / (sum(values[:3]) / 3) - 1.0


class Soak:
    def __init__(self, base: str, model: str, ns: argparse.Namespace, spot: list[tuple[str, list[int]]],
                 prompts: list[str]) -> None:
        self.base, self.model, self.ns, self.spot, self.prompts = base, model, ns, spot, prompts
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.mismatches: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def count(self, key: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if error:
                self.errors[error] += 1

    def completion(self, rng: random.Random, prompt: str, max_tokens: int, kind: str) -> None:
        status, body = _post(self.base, "/v1/completions", {"model": self.model, "prompt": prompt,
                                                            "max_tokens": max_tokens, "temperature": 0.0})
        self.count(kind, None if status == 200 else (f"http {status}" if status < 500 else "5xx"))

    def cancelled_stream(self, rng: random.Random, prompt: str) -> None:
        """Open a stream, read a few chunks, drop the connection (a client disconnect)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": 256, "temperature": 0.0, "stream": True}
        req = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            r = urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as e:
            self.count("cancelled", "5xx" if e.code >= 500 else f"http {e.code}")
            return
        except OSError as e:
            self.count("cancelled", f"connect: {type(e).__name__}")
            return
        try:
            for _ in range(rng.randint(1, 6)):
                if not r.readline():
                    break
        finally:
            r.close()
        self.count("cancelled")

    def long_prompt(self, rng: random.Random) -> None:
        """A prompt whose length + max_tokens is max_model_len (trimmed by the server's tokenizer)."""
        text = " ".join(self.prompts) * 4
        status, tok = _post(self.base, "/tokenize", {"model": self.model, "prompt": text})
        if status != 200 or tok is None:
            self.count("long", "5xx" if status >= 500 else f"tokenize {status}")
            return
        max_tokens = rng.randint(8, 64)
        ids = tok["tokens"][:MAX_MODEL_LEN - max_tokens]
        status, body = _post(self.base, "/v1/completions", {"model": self.model, "prompt": ids,
                                                            "max_tokens": max_tokens, "temperature": 0.0})
        self.count("long", None if status == 200 else ("5xx" if status >= 500 else f"http {status}"))

    def spot_check(self, index: int) -> None:
        prompt, want = self.spot[index]
        status, body = _post(self.base, "/v1/completions", {"model": self.model, "prompt": prompt,
                                                            "max_tokens": len(want), "temperature": 0.0,
                                                            "ignore_eos": True, "return_token_ids": True})
        if status != 200 or body is None:
            self.count("spot", "5xx" if status >= 500 else f"http {status}")
            return
        got = body["choices"][0].get("token_ids")
        self.count("spot")
        if got != want:
            with self.lock:
                self.mismatches.append({"prompt_index": index, "want": want, "got": got})

    def user(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            r = rng.random()
            prompt = rng.choice(self.prompts)
            if r < 0.15:
                self.cancelled_stream(rng, prompt)
            elif r < 0.20:
                self.long_prompt(rng)
            elif r < 0.25:
                self.spot_check(rng.randrange(len(self.spot)))
            else:
                self.completion(rng, prompt, rng.choice([8, 16, 32, 64, 128, 256]), "completion")

    def bursts(self) -> None:
        rng = random.Random(12345)
        while not self.stop.wait(self.ns.burst_every):
            threads = [threading.Thread(target=self.completion, args=(rng, rng.choice(self.prompts), 32, "burst"))
                       for _ in range(self.ns.burst_size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()


def reference_outputs(model: Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    from harness.serving import complete, serve

    with serve(model, ("--max-num-seqs", "4")) as server:
        return [complete(server.base_url, server.model, p, max_tokens=max_tokens).token_ids or []
                for p in prompts]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--preset", default="prompt-lookup")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=16)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--burst-every", type=float, default=30.0)
    p.add_argument("--burst-size", type=int, default=24, help="extra requests per burst (above max-num-seqs)")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup-fraction", type=float, default=0.2, help="share of the run before RSS counts")
    p.add_argument("--max-worker-growth", type=float, default=0.01,
                   help="pass bound on the worker's RSS growth after warm-up (0.01 = 1%%)")
    p.add_argument("--output", type=Path, default=RESULTS / "soak_code-lm.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from harness.comparison import treespec
    from treespec_fixtures import build_fixture
    from vllm_treespec.train.corpus import held_out_prompts
    from harness.report import hardware_info, software_info
    from harness.serving import serve

    ns = parse_args(argv)
    model = build_fixture(ns.fixture)
    prompts = [p for n, c in ((8, 200), (8, 600), (4, 1500)) for p in held_out_prompts(n, prompt_chars=c, seed=c)]
    spot_prompts = held_out_prompts(4, prompt_chars=400, seed=99)
    print("[soak] reference outputs with speculation off ...", flush=True)
    spot = list(zip(spot_prompts, reference_outputs(model, spot_prompts, 48)))
    args = ("--max-num-seqs", str(ns.max_num_seqs), "--max-model-len", str(MAX_MODEL_LEN),
            *treespec(ns.num_speculative_tokens, ns.preset).args)
    samples: list[dict[str, float]] = []
    crashed = None
    print("[soak] serving with speculation, load for --minutes ...", flush=True)
    with serve(model, args) as server:
        soak = Soak(server.base_url, server.model, ns, spot, prompts)
        threads = [threading.Thread(target=soak.user, args=(i,), daemon=True) for i in range(ns.users)]
        threads.append(threading.Thread(target=soak.bursts, daemon=True))
        start = time.monotonic()
        for t in threads:
            t.start()
        deadline = start + 60 * ns.minutes
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                crashed = f"server exited with code {server.proc.returncode}"
                break
            per = process_rss_mb(server.proc.pid)
            worker = worker_rss_mb(per)
            samples.append({"t_s": time.monotonic() - start, "rss_mb": sum(per.values()),
                            "worker_rss_mb": worker, "processes": per,
                            "requests": sum(soak.counts.values())})
            time.sleep(ns.sample_s)
        soak.stop.set()
        for t in threads:
            t.join(timeout=600)
        alive = server.proc.poll() is None
        if not alive and crashed is None:
            crashed = f"server exited with code {server.proc.returncode}"
    warm_samples = [s for s in samples if s["t_s"] >= ns.warmup_fraction * 60 * ns.minutes]
    group_growth = growth([s["rss_mb"] for s in warm_samples])
    worker_growth = growth([s["worker_rss_mb"] for s in warm_samples if s["worker_rss_mb"] is not None])
    result = {"benchmark": "soak", "hardware": hardware_info(), "software": software_info(),
              "model": Path(model).name, "preset": ns.preset, "args": vars(ns) | {"output": str(ns.output)},
              "requests": dict(soak.counts), "errors": dict(soak.errors),
              "server_errors_5xx": soak.errors.get("5xx", 0), "crashed": crashed,
              "rss_growth_after_warmup": group_growth, "worker_rss_growth_after_warmup": worker_growth,
              "spot_checks": soak.counts.get("spot", 0),
              "spot_mismatches": soak.mismatches, "samples": samples}
    ok = (result["server_errors_5xx"] == 0 and crashed is None and not soak.mismatches
          and group_growth is not None and group_growth < 0.05
          and worker_growth is not None and worker_growth < ns.max_worker_growth)
    result["pass"] = ok
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("requests", "errors", "server_errors_5xx", "crashed",
                                             "rss_growth_after_warmup", "worker_rss_growth_after_warmup",
                                             "spot_checks", "pass")}, indent=1))
    print(ns.output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
