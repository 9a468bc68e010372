"""Run and measure an OpenAI-compatible `vllm-treespec serve` server on 127.0.0.1.

Demo, benchmark and end-to-end tests all need the same three things: a server that starts on a
free loopback port and is always torn down (its whole process group: vLLM spawns engine-core and
worker processes), a client that replays prompts at a fixed concurrency, and the spec-decode
counters from `/metrics`. Only the standard library is used, so this works in any environment that
can run the server.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

HOST = "127.0.0.1"
# Flags every CPU run here needs: fp32 (the CPU backend's reliable dtype), no graph capture, a
# context that fits the fixtures. Callers append their speculation flags.
CPU_SERVE_ARGS: tuple[str, ...] = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "1024")


class ServerError(RuntimeError):
    """The server did not come up (crashed or timed out); the message carries its log tail."""


@dataclass
class Server:
    """A running server: where to reach it and where its log is."""
    base_url: str
    model: str
    log_path: Path
    proc: subprocess.Popen

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


def free_port() -> int:
    """An unused loopback TCP port (the OS picks; a race with other binders is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


@contextmanager
def _post(url: str, body: dict, timeout: float) -> Iterator[Any]:
    """The open response to a JSON POST; an HTTP error status raises with the server's reply."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            yield r
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise RuntimeError(f"POST {url} -> HTTP {e.code}: {detail}") from None


def _post_json(url: str, body: dict, timeout: float) -> dict:
    with _post(url, body, timeout) as r:
        return json.loads(r.read())


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left after `grace_s`."""
    pgid = proc.pid  # start_new_session=True made the server its own group leader
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader exited; give its children (engine core, workers) a moment, then check.
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        if not _group_alive(pgid):
            break
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def serve(model_dir: str | os.PathLike, extra_args: Sequence[str] = (), *,
          base_args: Sequence[str] = CPU_SERVE_ARGS, env: dict[str, str] | None = None,
          startup_timeout_s: float = 600.0, stop_grace_s: float = 20.0,
          keep_log: bool = False) -> Iterator[Server]:
    """Start `vllm-treespec serve MODEL_DIR` on a free 127.0.0.1 port; yield when /health is OK.

    The server runs in its own session so exit (normal, exception or Ctrl-C) can terminate the
    whole process group. The log goes to a temp file, deleted afterwards unless `keep_log` or the
    start failed; on failure `ServerError` includes the log tail and the log's path.
    """
    port = free_port()
    log_fd, log_name = tempfile.mkstemp(prefix=f"vllm-treespec-serve-{port}-", suffix=".log")
    log_path = Path(log_name)
    cmd = [sys.executable, "-m", "vllm_treespec.cli", "serve", str(model_dir),
           "--host", HOST, "--port", str(port), *base_args, *extra_args]
    full_env = dict(os.environ)
    full_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    full_env.update(env or {})
    with os.fdopen(log_fd, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
    server = Server(base_url=f"http://{HOST}:{port}", model=str(model_dir), log_path=log_path, proc=proc)
    failed = True
    try:
        _wait_healthy(server, startup_timeout_s)
        server.model = _served_model_name(server.base_url) or server.model
        failed = False
        yield server
    finally:
        _stop_group(proc, stop_grace_s)
        if not (keep_log or failed):
            log_path.unlink(missing_ok=True)


def group_processes(server: Server) -> list[int]:
    """Pids of the server's process group (API server, engine core, worker, helpers)."""
    pgid = os.getpgid(server.proc.pid)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return sorted(pids)


def pin_frontend(server: Server) -> dict[str, list[int]]:
    """Move every process of the server but its CPU worker onto the cores the worker leaves.

    vLLM's CPU worker binds its OpenMP threads to the cores it computes on and reserves the
    rest "for the scheduler process" (utils/ompmultiprocessing.py: on this 2-core VM, core 0
    for the worker, core 1 reserved), but nothing keeps the API server and the engine core off
    the worker's core: the kernel places them, and in a synchronous step the engine core spins
    while it waits for the worker (shm_broadcast's SpinCondition). Where they land moves from
    run to run. Pinned, the worker has its core to itself. Returns {"worker": cores,
    "frontend": cores}; a server whose worker holds every allowed core is left as it is."""
    allowed = os.sched_getaffinity(server.proc.pid)      # the API server's, as it started
    affinity = {pid: os.sched_getaffinity(pid) for pid in group_processes(server)}
    worker_cores: set[int] = set()
    for cores in affinity.values():
        if cores < allowed:                 # bound to a subset: the OpenMP-bound worker
            worker_cores |= cores
    frontend = allowed - worker_cores
    if not worker_cores or not frontend:
        return {"worker": sorted(worker_cores), "frontend": sorted(allowed)}
    for pid, cores in affinity.items():
        if cores & worker_cores and cores != worker_cores:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    os.sched_setaffinity(int(tid), frontend)
                except (ProcessLookupError, PermissionError):
                    continue
    return {"worker": sorted(worker_cores), "frontend": sorted(frontend)}


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        code = server.proc.poll()
        if code is not None:
            raise ServerError(f"server exited with code {code} before becoming healthy; "
                              f"log {server.log_path}, last lines:\n{server.log_tail()}")
        try:
            status, _ = _get(server.base_url + "/health", timeout=2.0)
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"server not healthy after {timeout_s:.0f} s; "
                              f"log {server.log_path}, last lines:\n{server.log_tail()}")
        time.sleep(0.5)


def _served_model_name(base_url: str) -> str | None:
    try:
        _, body = _get(base_url + "/v1/models")
        return json.loads(body)["data"][0]["id"]
    except Exception:
        return None


# -- load ----------------------------------------------------------------------------------

@dataclass
class RequestResult:
    """One completion: its output (token ids when the server returns them), size and latency;
    chat requests also return the token ids of the prompt the chat template rendered."""
    index: int
    text: str
    token_ids: list[int] | None
    output_tokens: int
    latency_s: float
    prompt_token_ids: list[int] | None = None
    # streamed requests only: seconds from the load's start to the send and to the last byte, and
    # (seconds from the load's start, tokens) of every chunk that carried output tokens
    start_s: float | None = None
    end_s: float | None = None
    chunks: list[tuple[float, int]] | None = None

    def output_key(self) -> tuple | str:
        """What exact-match compares: token ids if present, else the text."""
        return tuple(self.token_ids) if self.token_ids is not None else self.text


@dataclass
class LoadResult:
    """All requests of one load run (in prompt order) and the run's wall time."""
    requests: list[RequestResult]
    wall_s: float
    concurrency: int

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def latencies_s(self) -> list[float]:
        return [r.latency_s for r in self.requests]

    def steady(self) -> tuple[int, float] | None:
        """(output tokens, seconds) of the load's steady part: from its start until the first
        client finds no prompt left, so every client had a request in flight throughout (a
        closed loop of `concurrency` clients sends the last prompt at the completion that comes
        `len(requests) - concurrency` completions in; the steady part ends at the next one).
        What comes after is the drain (the batch shrinking as the last requests finish), which
        continuous traffic does not have and which weighs configs whose requests finish at
        different steps. Tokens count by the chunk times of streamed requests; None for a
        load that was not streamed. With one client, or as many prompts as clients, the steady
        part ends at the first completion that leaves a client idle: the whole load for one
        client, the first completion for one wave."""
        if not self.requests or any(r.chunks is None or r.end_s is None for r in self.requests):
            return None
        ends = sorted(r.end_s for r in self.requests)
        clients = min(self.concurrency, len(self.requests))
        cut = ends[len(self.requests) - clients]
        tokens = sum(n for r in self.requests for t, n in r.chunks if t <= cut)
        return tokens, cut


# A prompt is a completion prompt (text) or a chat request: anything with `.messages`
# (benchmarks/chat_prompts.py ChatPrompt) or the messages list itself.
Prompt = Union[str, Sequence[dict], Any]


def chat_messages(prompt: Prompt) -> list[dict] | None:
    """The chat messages of a prompt, None for a completion prompt (text or token ids)."""
    if isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], int)):
        return None
    messages = getattr(prompt, "messages", prompt)
    return [dict(m) for m in messages]


def complete(base_url: str, model: str, prompt: Prompt, *, max_tokens: int, temperature: float = 0.0,
             ignore_eos: bool = True, timeout_s: float = 600.0, index: int = 0,
             extra: dict | None = None, stream: bool = False, origin: float | None = None) -> RequestResult:
    """One `/v1/completions` request (text prompt) or `/v1/chat/completions` request (chat
    prompt), timed from send to full response. `extra` joins the request body. `stream`: the
    server streams its answer and every chunk's arrival is timed from `origin`
    (`time.perf_counter()`, default the send): the chunks tell when each token reached the
    client, as a streaming user sees them."""
    messages = chat_messages(prompt)
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": ignore_eos, "return_token_ids": True, **(extra or {})}
    if messages is None:
        body["prompt"] = prompt
    else:
        body["messages"] = messages
    url = base_url + ("/v1/completions" if messages is None else "/v1/chat/completions")
    if stream:
        return _complete_streamed(url, body, chat=messages is not None, timeout_s=timeout_s, index=index,
                                  origin=origin)
    t0 = time.perf_counter()
    resp = _post_json(url, body, timeout_s)
    latency = time.perf_counter() - t0
    choice = resp["choices"][0]
    token_ids = choice.get("token_ids")
    usage = resp.get("usage") or {}
    n_out = usage.get("completion_tokens")
    if n_out is None:
        n_out = len(token_ids) if token_ids is not None else 0
    text = choice.get("text", "") if messages is None else ((choice.get("message") or {}).get("content") or "")
    prompt_ids = resp.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return RequestResult(index=index, text=text,
                         token_ids=list(token_ids) if token_ids is not None else None,
                         output_tokens=int(n_out), latency_s=latency,
                         prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None)


def _complete_streamed(url: str, body: dict, *, chat: bool, timeout_s: float, index: int,
                       origin: float | None) -> RequestResult:
    """`complete` with `"stream": true`: reads the server-sent events, timing every chunk that
    carries output tokens (vLLM streams `token_ids` per chunk when `return_token_ids` is set;
    the final usage chunk counts the completion tokens)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    origin = t0 if origin is None else origin
    token_ids: list[int] = []
    text: list[str] = []
    chunks: list[tuple[float, int]] = []
    prompt_ids = None
    n_out = None
    with _post(url, body, timeout_s) as r:
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            event = json.loads(data)
            if event.get("usage") and event["usage"].get("completion_tokens") is not None:
                n_out = int(event["usage"]["completion_tokens"])
            prompt_ids = prompt_ids or event.get("prompt_token_ids")
            for choice in event.get("choices") or []:
                prompt_ids = prompt_ids or choice.get("prompt_token_ids")
                ids = choice.get("token_ids") or []
                if ids:
                    token_ids.extend(ids)
                    chunks.append((now - origin, len(ids)))
                text.append(((choice.get("delta") or {}).get("content") or "") if chat
                            else (choice.get("text") or ""))
    end = time.perf_counter()
    if n_out is not None and n_out != len(token_ids):
        raise RuntimeError(f"POST {url}: the stream carried {len(token_ids)} token ids, its usage says {n_out}")
    return RequestResult(index=index, text="".join(text), token_ids=token_ids, output_tokens=len(token_ids),
                         latency_s=end - t0, prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
                         start_s=t0 - origin, end_s=end - origin, chunks=chunks)


def run_load(server_or_url: Server | str, prompts: Sequence[Prompt], *, max_tokens: int,
             concurrency: int = 1, model: str | None = None, temperature: float = 0.0,
             ignore_eos: bool = True, timeout_s: float = 600.0, extra: dict | None = None,
             stream: bool = False) -> LoadResult:
    """Send `prompts` (text or chat, `complete`) with at most `concurrency` in flight (closed
    loop); results in prompt order. `extra` joins every request's body. `stream`: answers are
    streamed and their chunks timed from the load's start (`LoadResult.steady`)."""
    if isinstance(server_or_url, Server):
        base_url, model = server_or_url.base_url, model or server_or_url.model
    else:
        base_url = server_or_url
    if model is None:
        model = _served_model_name(base_url)
    if model is None:
        raise ValueError("model name unknown: pass model= or a Server")
    concurrency = max(1, int(concurrency))

    def one(i: int) -> RequestResult:
        return complete(base_url, model, prompts[i], max_tokens=max_tokens, temperature=temperature,
                        ignore_eos=ignore_eos, timeout_s=timeout_s, index=i, extra=extra, stream=stream,
                        origin=t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load") as pool:
        results = list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - t0
    return LoadResult(requests=results, wall_s=wall, concurrency=concurrency)


# -- metrics -------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_DRAFTS = "vllm:spec_decode_num_drafts_total"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass
class SpecMetrics:
    """vLLM's spec-decode counters (summed over engines); subtract two scrapes for a window.

    `present` is False when the server exports no spec-decode series (speculation off).
    """
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False
    tree: dict[str, float] = field(default_factory=dict)   # treespec_* series, summed over labels

    def __sub__(self, other: "SpecMetrics") -> "SpecMetrics":
        pos = {p: v - other.accepted_per_pos.get(p, 0.0) for p, v in self.accepted_per_pos.items()}
        tree = {k: v - other.tree.get(k, 0.0) for k, v in self.tree.items()}
        return SpecMetrics(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                           self.accepted - other.accepted, pos, self.present, tree)

    def tree_ms_per_step(self, series: str) -> float | None:
        """Mean milliseconds per step of a treespec_*_seconds histogram over the window."""
        count = self.tree.get(f"{series}_count", 0.0)
        return 1e3 * self.tree.get(f"{series}_sum", 0.0) / count if count > 0 else None

    @property
    def tau(self) -> float | None:
        """Tokens emitted per verification step (counts the bonus token): 1 + accepted / drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None


def parse_spec_metrics(text: str) -> SpecMetrics:
    """Parse the spec-decode counters out of Prometheus text exposition."""
    m = SpecMetrics()
    for line in text.splitlines():
        if line.startswith("treespec_") and (s := _SAMPLE.match(line)) and not s["name"].endswith("_created"):
            if "_bucket" not in s["name"]:
                m.tree[s["name"]] = m.tree.get(s["name"], 0.0) + float(s["value"])
            continue
        if not line.startswith("vllm:spec_decode"):
            continue
        s = _SAMPLE.match(line)
        if not s:
            continue
        name, value = s["name"], float(s["value"])
        if name == _DRAFTS:
            m.drafts += value
        elif name == _DRAFT_TOKENS:
            m.draft_tokens += value
        elif name == _ACCEPTED:
            m.accepted += value
        elif name == _PER_POS:
            labels = dict(_LABEL.findall(s["labels"] or ""))
            if "position" in labels:
                p = int(labels["position"])
                m.accepted_per_pos[p] = m.accepted_per_pos.get(p, 0.0) + value
        else:
            continue
        m.present = True
    return m


def scrape_spec_metrics(server_or_url: Server | str, settle_s: float = 0.5) -> SpecMetrics:
    """GET /metrics and parse it. `settle_s` lets the last step's stats reach the API server
    (they are recorded after the step's outputs are sent to clients)."""
    base_url = server_or_url.base_url if isinstance(server_or_url, Server) else server_or_url
    if settle_s > 0:
        time.sleep(settle_s)
    _, body = _get(base_url + "/metrics", timeout=10.0)
    return parse_spec_metrics(body.decode(errors="replace"))


__all__ = ["CPU_SERVE_ARGS", "HOST", "LoadResult", "RequestResult", "Server", "ServerError",
           "SpecMetrics", "complete", "free_port", "parse_spec_metrics", "run_load",
           "scrape_spec_metrics", "serve"]
