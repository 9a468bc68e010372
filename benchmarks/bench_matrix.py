"""Regime matrix: speculative configs vs no speculation at every temperature x concurrency.

The same model behind one OpenAI server per config (`vllm-treespec serve`, vLLM's default dtype unless --dtype,
i.e. bf16 for the float32 fixtures on this CPU; `--enforce-eager --max-model-len 1024`), and for
every regime {greedy, T=0.7, T=1.0} x {1, 8, 32 concurrent clients} the tokens/s of each config
as a ratio to `off` (speculation off) measured in the same cell. Prompts are UNSEEN code:
function heads (signature + docstring) of third-party packages in site-packages
(`benchmarks/unseen_prompts.py`), never the stdlib the fixture models were trained on; every
request emits exactly --max-tokens tokens (`ignore_eos`).

    .venv/bin/python benchmarks/bench_matrix.py                      # code-lm, the default configs, 1 round
    .venv/bin/python benchmarks/bench_matrix.py --rounds 3           # more paired batches per cell
    .venv/bin/python benchmarks/bench_matrix.py --configs off ngram:12 default:8 prompt-lookup-tree:16
    .venv/bin/python benchmarks/bench_matrix.py --fixture tiny --configs off ngram:4 default:4 \
        --num-prompts 8 --max-tokens 16 --concurrency 1 8 --temperatures 0 0.7 --output /tmp/m.json

Configs (--configs): `off`; `off-sync` (no speculation and `--no-async-scheduling`. On a GPU this
shows what a speculative config pays for synchronous scheduling alone: vLLM 0.32 turns async
scheduling off for every speculative method but EAGLE/MTP, draft_model, DFlash and the GPU
ngram. On CPU vLLM schedules every server synchronously, so there it is a second `off` server:
an A/A control whose ratio shows the noise of the cell, tests/test_vllm_cpu_scheduling.py); `ngram:K` (vLLM's
ngram, n-gram range 1..4); `suffix:K` (vLLM's SuffixDecoding, needs the arctic-inference
package: benchmarks/install_suffix.sh); `default:K` (treespec with no `treespec` key in
--additional-config: the plugin's default preset); `PRESET:K` (treespec with that preset name,
YAML path or inline JSON mapping, e.g. `demo/lookup-trie-distilled:32`). `off` is always served (added first when not named).

Fairness on a 2-core machine. All servers start up front (one after the other, ~2.5 GB RSS
each: the free memory is checked first; with --fresh-servers again before every round, so that
no server answers a chat prompt twice), get a short warm-up, then TAKE TURNS: in each regime
cell the prompts are split into batches of max(8, WAVES x concurrency) (--waves, default 2; at
most all of them; --waves and --num-prompts take one value or one per --concurrency value, e.g.
`--concurrency 1 8 32 --num-prompts 32 32 256 --waves 2 2 8`: at 32 clients a turn of 2 waves
is mostly the server's drain, which continuous traffic does not have) and
every server runs each batch in turn, the order rotating by one from batch to batch (the
rotation runs on across cells and rounds), with an idle gap (--idle-gap, 1.5 s) after every
turn. Servers start in --configs order; `--start-order rotate` with --fresh-servers rotates it
by one per lifetime, so that a server's place in the start order (which may decide where its
memory lies) is shared out too (each server's `start_position` is recorded). The gap is there
because an idle vLLM server is not idle right after it served: its shared-memory broadcast
readers (vllm/distributed/device_communicators/shm_broadcast.py,
SpinCondition, busy_loop_s=1) keep spinning for 1 s after their last read and would steal the
next server's cores. Each turn is timed; a config's tokens/s in a cell is its output tokens over
its summed turn seconds, so machine drift hits every config of a batch alike. --rounds N repeats
the matrix. The reported ratio is the median, over every batch of the cell in every round, of the
config's tokens/s over `off`'s in the same batch (adjacent turns): on this VM single turns swing
by 30% (four processes and the client share two cores), and the median of many paired turns
holds still where the median of two or three pooled rounds does not. Every round's pooled ratio
(summed tokens over summed seconds) is kept beside it (`ratio_rounds`).

Steady ratios. Answers are streamed by default (--no-stream asks for whole answers), so every
token has a time. A turn of W waves ends with its slowest request alone on the server, tau ~1 for
a drafter and one row per step for everyone: continuous traffic never has that drain.
`ratio_steady` is the same paired median over each turn's steady part, the tokens and seconds up
to the moment the first client finds no prompt left (`LoadResult.steady`), i.e. while every
client had a request in flight. The whole-turn ratio stays the acceptance measure; the steady one
beside it says how much of a gap is the turn's drain.

Drift-corrected ratios. Even the median of paired turns moved by tens of percent between runs
here: an A/A pair (`off` against `off-sync`) read 0.65-1.06x. The VM's speed during a turn is
what moves, and the model forward of the same rows is a yardstick of it. Every server therefore
sums its own forward seconds into a file the client reads around each turn
(`harness/forward_clock.py`, loaded into the server through PYTHONPATH, nothing in the plugin),
and `ratio_drift_corrected` is the same median with each turn's seconds divided by that turn's
forward seconds (`bench_paired` does the same offline). It measures each config's time outside
the forward per unit of forward; it holds where both sides verify about the same rows (sampled
cells in which gain control drafts little), and it is not a speedup where one side verifies many
more rows (greedy cells, which have margin to spare on the raw ratio).

Each (round, cell) gets its own prompts by default (--shared-prompts: one set everywhere). Two
reasons: SuffixDecoding caches past responses in a global tree (up to 10000 requests) and would
be served prompts it has already answered in greedy cells, and vLLM's prefix cache would skip
repeated prefills for every config.

Per cell the record also keeps tau / acceptance (spec-decode counters on /metrics, scraped before
and after the cell) with `tau_bound`, the most the cell's output allows (vLLM also counts drafts
accepted past max_tokens, see `tau_bound`), and in greedy cells output equality with `off` (token ids). Every greedy
mismatch is explained: at the first differing token the `off` server is asked (the prompt's
token ids + the common prefix as a token-id prompt, so no retokenization; max_tokens 1) for its
top-2 logprobs and the logprobs of both diverging tokens; a bf16 near-tie shows as a small gap.

Writes `benchmarks/results/bench_matrix_<fixture>.json` (or --output) and a heatmap PNG of the
ratios beside it, and prints the ratio table in markdown.
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:              # unseen_prompts, bench_serving (also when imported by tests)
    sys.path.insert(0, str(_HERE))

from harness.paired_stats import lower_middle, median_interval  # noqa: E402

RESULTS_DIR = _HERE / "results"
DEFAULT_CONFIGS = ["off", "ngram:12", "suffix:24", "default:8", "demo/lookup-trie-distilled:32"]
SERVER_GIB = 3.2            # RSS of one server (API server + engine core + worker): 2.9-3.0 GB measured on tiny
WARMUP_MAX_TOKENS = 16
BASELINE = "off"
SPEC_FORMS = ("expected off, off-sync, ngram:K, suffix:K, default:K or PRESET:K (PRESET a preset name, "
              "YAML path or inline JSON mapping; K a positive integer)")


# -- configs (pure) --------------------------------------------------------------------------

@dataclass(frozen=True)
class MatrixConfig:
    spec: str                   # as given on the command line
    label: str                  # table column
    kind: str                   # off | ngram | suffix | treespec
    k: int | None
    args: tuple[str, ...]       # extra `serve` flags
    engine_kwargs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def parse_config(spec: str) -> MatrixConfig:
    """One --configs entry. ValueError (with the accepted forms) for a malformed one; a treespec
    config that does not load is checked by `check_config`."""
    from harness.comparison import (ngram_engine_kwargs, no_spec, treespec, treespec_engine_kwargs,
                                          treespec_value, vllm_ngram)

    spec = spec.strip()
    if spec == "off":
        return MatrixConfig(spec, "off", "off", None, no_spec().args)
    if spec == "off-sync":      # no speculation, no async scheduling (on CPU: the same server as off)
        return MatrixConfig(spec, "off-sync", "off-sync", None, (*no_spec().args, "--no-async-scheduling"))
    name, sep, k_text = spec.rpartition(":")
    if not sep or not name.strip():
        raise ValueError(f"config {spec!r}: {SPEC_FORMS}")
    if not k_text.strip().isdigit() or int(k_text) < 1:
        raise ValueError(f"config {spec!r}: K must be a positive integer, got {k_text!r}; {SPEC_FORMS}")
    k, name = int(k_text), name.strip()
    if name == "ngram":
        return MatrixConfig(spec, f"ngram K={k}", "ngram", k, vllm_ngram(k).args, ngram_engine_kwargs(k))
    if name == "suffix":
        sc = {"method": "suffix", "num_speculative_tokens": k}
        return MatrixConfig(spec, f"suffix K={k}", "suffix", k, ("--speculative-config", json.dumps(sc)),
                            {"speculative_config": sc})
    if name == "default":       # no treespec key at all: the plugin picks its default preset
        sc = treespec_engine_kwargs(k)["speculative_config"]
        return MatrixConfig(spec, f"default K={k}", "treespec", k, ("--speculative-config", json.dumps(sc)),
                            {"speculative_config": sc})
    try:
        value = treespec_value(name)
    except json.JSONDecodeError as e:
        raise ValueError(f"config {spec!r}: inline treespec JSON does not parse: {e}") from None
    if not isinstance(value, (str, dict)):
        raise ValueError(f"config {spec!r}: inline treespec JSON must be a mapping")
    label = f"{name if isinstance(value, str) else 'inline'} K={k}"
    return MatrixConfig(spec, label, "treespec", k, treespec(k, value).args, treespec_engine_kwargs(k, value))


def check_config(cfg: MatrixConfig) -> None:
    """Load a treespec config as the engine would (ConfigError, a ValueError, when it does not)."""
    if cfg.kind != "treespec":
        return
    from vllm_treespec.config import from_engine_args

    from_engine_args(cfg.engine_kwargs["speculative_config"], cfg.engine_kwargs.get("additional_config"))


def parse_configs(specs: Sequence[str], check: bool = True) -> list[MatrixConfig]:
    """--configs -> configs, `off` first (added when missing). ValueError for a bad or repeated
    spec or two specs with the same label."""
    configs = [parse_config(s) for s in specs]
    if not any(c.kind == "off" for c in configs):
        configs.insert(0, parse_config("off"))
    configs.sort(key=lambda c: c.kind != "off")          # stable: off first, the rest as given
    labels = [c.label for c in configs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"configs repeat {dup}: every config must be distinct")
    if check:
        for c in configs:
            check_config(c)
    return configs


def check_suffix_available() -> None:
    """RuntimeError unless the SuffixDecoding backend imports in this interpreter (the servers
    run it too)."""
    r = subprocess.run([sys.executable, "-c", "import arctic_inference.suffix_decoding"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"suffix:K needs the arctic-inference package, which does not import here "
                           f"({last}); install it with benchmarks/install_suffix.sh, or leave suffix "
                           "out of --configs")


def serve_args_default_dtype(args: Sequence[str]) -> tuple[str, ...]:
    """`args` without any --dtype flag, so the server runs the model's default dtype."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--dtype":
            skip = True
        elif not a.startswith("--dtype="):
            out.append(a)
    return tuple(out)


def matrix_serve_args(args: Sequence[str], dtype: str | None) -> tuple[str, ...]:
    """The servers' base flags: `args` at vLLM's default dtype, or at `dtype` (--dtype)."""
    return serve_args_default_dtype(args) + (("--dtype", dtype) if dtype else ())


# -- schedule (pure) -------------------------------------------------------------------------

@dataclass(frozen=True)
class Regime:
    temperature: float
    concurrency: int

    @property
    def label(self) -> str:
        t = "greedy" if self.temperature == 0 else f"T={self.temperature:g}"
        return f"{t} c={self.concurrency}"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def regimes(temperatures: Sequence[float], concurrencies: Sequence[int]) -> list[Regime]:
    """Temperature-major: every concurrency of the first temperature, then the next."""
    return [Regime(float(t), int(c)) for t in temperatures for c in concurrencies]


def batch_size(num_prompts: int, concurrency: int, waves: int = 2) -> int:
    """Prompts per turn: `waves` x concurrency (at least 8, at most all). Each turn fills and
    drains the server once; more waves make the drain a smaller part of it (continuous traffic
    has none; a drain penalizes configs whose requests finish at different steps)."""
    return max(1, min(max(8, waves * concurrency), num_prompts))


def per_concurrency(values: Sequence[int], concurrencies: Sequence[int], flag: str) -> dict[int, int]:
    """concurrency -> value of a flag given once for all concurrencies or once per --concurrency
    value (in its order), e.g. `--concurrency 1 8 32 --waves 2 2 8`."""
    if len(values) == 1:
        return {int(c): int(values[0]) for c in concurrencies}
    if len(values) != len(concurrencies):
        raise ValueError(f"{flag} takes one value or one per --concurrency value ({len(concurrencies)}), "
                         f"got {len(values)}")
    return {int(c): int(v) for c, v in zip(concurrencies, values)}


def batches(num_prompts: int, concurrency: int, waves: int = 2) -> list[range]:
    """Consecutive prompt index ranges of `batch_size` (the last may be shorter)."""
    size = batch_size(num_prompts, concurrency, waves)
    return [range(i, min(i + size, num_prompts)) for i in range(0, num_prompts, size)]


def prompt_lifetimes(round_sizes: Sequence[int], rounds: int, shared: bool = False,
                     fresh_servers: bool | str = False, lives_per_round: int = 1) -> list[list[int]]:
    """The prompt-set sizes each server lifetime needs, one list per lifetime: one lifetime for the
    whole run (every round's sets drawn from one pool, so none repeats while the pool lasts), one
    per round with --fresh-servers (`lives_per_round` per round with --fresh-servers temperature:
    a round's cells split into that many consecutive lives, one per temperature), and a single set
    of the largest size with --shared-prompts."""
    if shared:
        return [[max(round_sizes)]]
    if fresh_servers:
        step = len(round_sizes) // lives_per_round
        per_round = [list(round_sizes[i:i + step]) for i in range(0, len(round_sizes), step)]
        return [sizes for _ in range(rounds) for sizes in per_round]
    return [list(round_sizes) * rounds]


def turn_order(num_configs: int, turn: int) -> list[int]:
    """Config indices in the order they run batch number `turn` (a rotation by `turn`)."""
    return [(turn + j) % num_configs for j in range(num_configs)]


def start_order(num_configs: int, life: int, rule: str) -> list[int]:
    """Config indices in the order lifetime `life` starts their servers: as given, or (`rotate`)
    rotated by `life`, so that over n fresh lifetimes every config starts once in each position
    (a server started later may be placed worse in memory; the A/A shows whether it is)."""
    if rule == "given":
        return list(range(num_configs))
    if rule == "rotate":
        return turn_order(num_configs, life)
    raise ValueError(f"unknown start order {rule!r}")


# -- arithmetic (pure) -----------------------------------------------------------------------

def median_index(values: Sequence[float]) -> int:
    """Index of the median value (the lower middle for an even count)."""
    ranked = sorted(range(len(values)), key=lambda i: values[i])
    return ranked[(len(ranked) - 1) // 2]


def summarize_cell(per_round: Sequence[dict[str, tuple[int, float]]], baseline: str = BASELINE
                   ) -> dict[str, dict[str, Any]]:
    """per_round[r][label] = (output tokens, summed turn seconds) of one cell -> per label: every
    round's tokens/s and ratio to `baseline` (same round), and the median round's ratio (for the
    baseline: the median round by tokens/s)."""
    out = {}
    for label in per_round[0]:
        rates = [r[label][0] / r[label][1] if r[label][1] > 0 else 0.0 for r in per_round]
        base = [r[baseline][0] / r[baseline][1] if r[baseline][1] > 0 else 0.0 for r in per_round]
        ratios = [x / b if b > 0 else None for x, b in zip(rates, base)]
        if label == baseline or any(x is None for x in ratios):
            i = median_index(rates)
            ratio = None if label == baseline else ratios[i]
        else:
            i = median_index(ratios)
            ratio = ratios[i]
        out[label] = {"tokens_per_s": rates[i], "ratio": ratio, "median_round": i,
                      "tokens_per_s_rounds": rates,
                      "ratio_rounds": None if label == baseline else ratios,
                      "output_tokens_rounds": [r[label][0] for r in per_round],
                      "seconds_rounds": [r[label][1] for r in per_round]}
    return out


def turn_ratios(turns: Sequence[tuple[int, float, int, float]]) -> list[float]:
    """(config tokens/s) / (off tokens/s) of every complete batch; turns: (config tokens, config
    seconds, off tokens, off seconds) per batch, any rounds."""
    return [(t / s) / (bt / bs) for t, s, bt, bs in turns if s > 0 and bs > 0 and bt > 0]


def paired_ratio(turns: Sequence[tuple[int, float, int, float]]) -> float | None:
    """Median over a cell's batches of (config tokens/s) / (off tokens/s) in the same batch
    (`turn_ratios`). The lower middle for an even count; None without a complete turn."""
    return lower_middle(turn_ratios(turns))


def interval_entry(ratios: Sequence[float], level: float = 0.9) -> list[float] | None:
    """[low, high] of the bootstrap interval of the ratios' median (harness/paired_stats.py)."""
    got = median_interval(list(ratios), level)
    return None if got is None else [round(got[1], 4), round(got[2], 4)]


def corrected_turn_ratios(turns: Sequence[tuple[int, float, float, int, float, float]]) -> list[float]:
    """The drift-corrected ratio (harness.forward_clock) of every batch whose forward seconds were
    read on both sides; turns: (tokens, seconds, forward seconds, off tokens, off seconds, off
    forward seconds) per batch."""
    from harness.forward_clock import drift_corrected

    return [r for r in (drift_corrected(*t) for t in turns) if r is not None]


def paired_corrected_ratio(turns: Sequence[tuple[int, float, float, int, float, float]]) -> float | None:
    """Median over a cell's batches of the drift-corrected ratio (`corrected_turn_ratios`).
    None without a batch whose forward seconds were read on both sides."""
    return lower_middle(corrected_turn_ratios(turns))


def summed_corrected_ratio(turns: Sequence[tuple[int, float, float, int, float, float]]) -> float | None:
    """The drift-corrected ratio of a cell's summed tokens, seconds and forward seconds."""
    from harness.forward_clock import drift_corrected

    return drift_corrected(*(sum(t[i] for t in turns) for i in range(6))) if turns else None


def parts_summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """A config's step parts over a cell (all rounds' turns): each part's seconds per second of its
    own forward (so the VM's speed during each turn cancels, as in the drift correction) and per
    output token, and engine steps per output token. Served wall seconds ride along as "wall"."""
    parts: dict[str, float] = {}
    calls: dict[str, int] = {}
    wall = tokens = 0.0
    for e in rounds:
        for turn, secs, toks in zip(e.get("turn_parts") or [], e["turn_seconds"], e["turn_tokens"]):
            for k, (sec, n) in turn.items():
                parts[k] = parts.get(k, 0.0) + sec
                calls[k] = calls.get(k, 0) + n
            wall += secs
            tokens += toks
    forward = parts.get("forward", 0.0)
    if forward <= 0 or tokens <= 0:
        return None
    per_forward = {k: round(v / forward, 4) for k, v in parts.items()}
    per_forward["wall"] = round(wall / forward, 4)
    return {"per_forward": per_forward,
            "ms_per_token": {k: round(1e3 * v / tokens, 4) for k, v in {**parts, "wall": wall}.items()},
            "engine_steps_per_token": round(calls.get("engine_step", 0) / tokens, 4)}


def parts_table(cells: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: per cell and config, each step part's seconds per forward second."""
    from harness.forward_clock import SLOTS

    cols = [*SLOTS[1:], "wall"]
    lines = ["| regime | config | " + " | ".join(cols) + " | steps/token |",
             "| --- | --- | " + " | ".join("---:" for _ in cols) + " | ---: |"]
    for c in cells:
        for lb in labels:
            p = c["configs"][lb].get("parts")
            if not p:
                continue
            vals = [f"{p['per_forward'].get(k, 0.0):.3f}" for k in cols]
            lines.append(f"| {c['regime']} | {lb} | " + " | ".join(vals) + f" | {p['engine_steps_per_token']:.3f} |")
    return "\n".join(lines)


def pooled_tau(windows: Sequence[tuple[float, float]]) -> float | None:
    """tau over several (drafts, accepted) windows: 1 + sum accepted / sum drafts."""
    drafts = sum(d for d, _ in windows)
    return 1.0 + sum(a for _, a in windows) / drafts if drafts > 0 else None


def tau_bound(windows: Sequence[tuple[float, float]]) -> float | None:
    """The highest tau the output allows over several (drafts, output tokens) windows: every
    drafted step returns at least its bonus token, so tau <= output tokens / drafts. vLLM counts
    drafts accepted past a request's max_tokens (its scheduler takes accepted counts before the
    stop check cuts them), so a method that drafts past the end (`suffix`) can report a tau above
    this bound; treespec caps its drafts at the request's output room."""
    drafts = sum(d for d, _ in windows)
    return sum(t for _, t in windows) / drafts if drafts > 0 else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where the two sequences differ (the shorter length when one is a prefix
    of the other), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def parse_top_logprobs(top: dict[str, float]) -> list[tuple[int, float]]:
    """A completions `top_logprobs` entry with `return_tokens_as_token_ids` ({"token_id:ID": lp})
    -> [(id, lp)] by decreasing logprob (ties by id)."""
    out = []
    for key, lp in top.items():
        if not key.startswith("token_id:"):
            raise ValueError(f"top_logprobs key {key!r} is not token_id:ID (return_tokens_as_token_ids off?)")
        out.append((int(key.split(":", 1)[1]), float(lp)))
    return sorted(out, key=lambda x: (-x[1], x[0]))


def markdown_table(cells: Sequence[dict[str, Any]], labels: Sequence[str], key: str = "ratio",
                   fmt: str = "{:.2f}x") -> str:
    """Regime rows x config columns (`labels`, off excluded by the caller) of one per-config
    value of the cells; '-' where missing."""
    lines = ["| regime | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for cell in cells:
        vals = []
        for label in labels:
            v = cell["configs"].get(label, {}).get(key)
            vals.append("-" if v is None else fmt.format(v))
        lines.append(f"| {cell['regime']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def interval_table(cells: Sequence[dict[str, Any]], labels: Sequence[str], key: str = "ratio") -> str:
    """Markdown: regime rows x config columns of `ratio (low-high)`, the raw paired median and its
    bootstrap interval; '-' where missing."""
    lines = ["| regime | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for cell in cells:
        vals = []
        for label in labels:
            e = cell["configs"].get(label, {})
            r, iv = e.get(key), e.get(f"{key}_interval")
            vals.append("-" if r is None else f"{r:.2f}x" + (f" ({iv[0]:.2f}-{iv[1]:.2f})" if iv else ""))
        lines.append(f"| {cell['regime']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# -- measuring -------------------------------------------------------------------------------

def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def server_rss_mib(server: Any) -> float | None:
    """RSS of the server's process and all its children (API server, engine core, worker)."""
    try:
        import psutil

        root = psutil.Process(server.proc.pid)
        procs = [root, *root.children(recursive=True)]
        return round(sum(p.memory_info().rss for p in procs) / 2**20, 1)
    except Exception:
        return None


def server_dtype(server: Any) -> str | None:
    """The dtype the engine reports in its config line (read from the server's log)."""
    try:
        m = re.search(r"dtype=(torch\.\w+)", server.log_path.read_text(errors="replace"))
    except OSError:
        return None
    return m.group(1) if m else None


def explain_mismatch(server: Any, prompt: Any, off_ids: list[int], spec_ids: list[int],
                     prompt_ids: list[int] | None = None) -> dict[str, Any]:
    """Why a greedy output left `off`'s: the `off` server's logprobs at the first difference,
    given exactly the prompt's tokens + the common prefix (a token-id prompt). `prompt_ids`: the
    prompt's token ids as the server rendered them (chat requests return them); a text prompt
    without them is tokenized by the server."""
    from harness.serving import _post_json

    pos = first_difference(off_ids, spec_ids)
    out: dict[str, Any] = {"position": pos}
    if pos is None or pos >= min(len(off_ids), len(spec_ids)):
        out["note"] = "outputs differ in length only"
        return out
    off_tok, spec_tok = off_ids[pos], spec_ids[pos]
    out.update(off_token=off_tok, spec_token=spec_tok)
    try:
        if prompt_ids is None:
            prompt_ids = _post_json(server.base_url + "/tokenize", {"model": server.model, "prompt": prompt},
                                    60)["tokens"]
        body = {"model": server.model, "prompt": list(prompt_ids) + list(off_ids[:pos]), "max_tokens": 1,
                "temperature": 0.0, "ignore_eos": True, "logprobs": 2, "return_tokens_as_token_ids": True}
        choice = _post_json(server.base_url + "/v1/completions", body, 120)["choices"][0]
        top = parse_top_logprobs(choice["logprobs"]["top_logprobs"][0])
        pair = _post_json(server.base_url + "/v1/completions",
                          {**body, "logprob_token_ids": [off_tok, spec_tok]}, 120)["choices"][0]
        lp = dict(parse_top_logprobs(pair["logprobs"]["top_logprobs"][0]))
    except Exception as e:      # an explanation must never sink the run
        out["error"] = f"{type(e).__name__}: {e}"[:500]
        return out
    out.update(top2=[[t, lp_] for t, lp_ in top[:2]],
               top2_gap=top[0][1] - top[1][1] if len(top) > 1 else None,
               off_token_logprob=lp.get(off_tok), spec_token_logprob=lp.get(spec_tok),
               off_minus_spec=(lp[off_tok] - lp[spec_tok]) if off_tok in lp and spec_tok in lp else None,
               off_argmax_reproduced=top[0][0] == off_tok)
    return out


def _one_or_per_concurrency(values: dict[int, int]) -> int | dict[str, int]:
    """A per-concurrency setting for the record: one number when it is the same everywhere."""
    distinct = set(values.values())
    return distinct.pop() if len(distinct) == 1 else {str(c): v for c, v in values.items()}


def _prompts_line(ns: argparse.Namespace) -> str:
    per = _one_or_per_concurrency(ns.prompts_for)
    if isinstance(per, int):
        return f"{per} prompts"
    return "prompts " + ", ".join(f"{n} at c={c}" for c, n in per.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="code-lm", help="fixture model (tiny for quick checks)")
    p.add_argument("--model-dir", default=None, help="serve this model directory instead of a fixture")
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, metavar="SPEC",
                   help=f"{SPEC_FORMS} (default: {' '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--num-prompts", type=int, nargs="+", default=[64],
                   help="prompts per regime cell: one value, or one per --concurrency value")
    p.add_argument("--max-tokens", type=int, default=128, help="most output tokens per request")
    p.add_argument("--prompts", choices=("auto", "code", "chat"), default="auto",
                   help="code: unseen code completions (/v1/completions, unseen_prompts.py); chat: MT-Bench "
                        "and HumanEval chat requests (/v1/chat/completions, chat_prompts.py); auto: chat for "
                        "a model with a chat template (smollm2-135m), code otherwise")
    p.add_argument("--ignore-eos", choices=("auto", "yes", "no"), default="auto",
                   help="yes: every request emits exactly --max-tokens; no: answers end at EOS as a user "
                        "sees them; auto: yes for code prompts, no for chat")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    p.add_argument("--waves", type=int, nargs="+", default=[2],
                   help="prompts per turn = WAVES x concurrency (at least 8): each turn fills and drains "
                        "the server once, so more waves weigh the drain less; one value, or one per "
                        "--concurrency value")
    p.add_argument("--rounds", type=int, default=1, help="repeat the matrix (more paired batches per cell)")
    p.add_argument("--idle-gap", type=float, default=1.5,
                   help="seconds of idle after every turn (vLLM's shm readers spin 1 s after a read)")
    p.add_argument("--pin-frontend", action="store_true",
                   help="after each server starts, move its API server and engine core (and this "
                        "client) onto the cores its CPU worker leaves (harness.serving.pin_frontend)")
    p.add_argument("--seed", type=int, default=0, help="prompt sampling seed")
    p.add_argument("--shared-prompts", action="store_true",
                   help="the same prompts in every cell and round (default: fresh prompts per cell and round)")
    p.add_argument("--fresh-servers", nargs="?", const="round", default=None, choices=("round", "temperature"),
                   help="restart every server before each round (one after another, warmed up again), so "
                        "no server answers a prompt twice: the chat pool holds 244 prompts, and drafters that "
                        "learn from what they served (vLLM suffix, lookup-online) draft a repeat from their "
                        "earlier answer. Lifetime i's prompts come from the pool shuffled by --seed + i. "
                        "`--fresh-servers temperature`: before each temperature of each round, for runs "
                        "whose rounds need more prompts than the pool holds")
    p.add_argument("--start-order", choices=("given", "rotate"), default="given",
                   help="the order servers start in: as --configs lists them, or rotated by one per "
                        "lifetime (with --fresh-servers, every config starts in every position over as many "
                        "lifetimes as configs; the record keeps each server's start_position)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="serve every config in this dtype (default: vLLM's default, bf16 on CPU). On a CPU "
                        "without native bf16 (AVX2 only) vLLM's bf16 is emulated and far slower "
                        "than float32, a regime no deployment would choose")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask for whole answers instead of streamed ones (default: streamed, as chat users "
                        "see them; streaming times every token and gives the steady ratio)")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON path (default: benchmarks/results/bench_matrix_<fixture>.json); the PNG goes beside it")
    ns = p.parse_args(argv)
    for flag, value, low in (("--rounds", ns.rounds, 1), ("--num-prompts", min(ns.num_prompts), 1),
                             ("--waves", min(ns.waves), 1),
                             ("--max-tokens", ns.max_tokens, 1), ("--concurrency", min(ns.concurrency), 1)):
        if value < low:
            p.error(f"{flag} must be at least {low}, got {value}")
    if ns.idle_gap < 0 or min(ns.temperatures) < 0:
        p.error("--idle-gap and --temperatures must be >= 0")
    if len(set(ns.concurrency)) != len(ns.concurrency) or len(set(ns.temperatures)) != len(ns.temperatures):
        p.error("--concurrency and --temperatures must not repeat a value")
    if ns.start_order == "rotate" and not ns.fresh_servers:
        p.error("--start-order rotate needs --fresh-servers: without restarts every server starts once, "
                "in --configs order")
    try:
        ns.prompts_for = per_concurrency(ns.num_prompts, ns.concurrency, "--num-prompts")
        ns.waves_for = per_concurrency(ns.waves, ns.concurrency, "--waves")
    except ValueError as e:
        p.error(str(e))
    try:
        ns.matrix_configs = parse_configs(ns.configs)
    except (ValueError, json.JSONDecodeError) as e:     # ConfigError is a ValueError
        p.error(str(e))
    if any(c.kind == "suffix" for c in ns.matrix_configs):
        try:
            check_suffix_available()
        except RuntimeError as e:
            p.error(str(e))
    if ns.idle_gap < 1.0:
        _log(f"warning: --idle-gap {ns.idle_gap} s is under vLLM's 1 s shm busy-loop; idle servers will "
             "steal cycles from the measured one")
    return ns


def prompt_kind(choice: str, model_dir: Path) -> str:
    """`--prompts auto`: chat for a model whose tokenizer has a chat template, code otherwise."""
    if choice != "auto":
        return choice
    try:
        cfg = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return "code"
    return "chat" if cfg.get("chat_template") else "code"


def build_prompt_sets(kind: str, set_sizes: Sequence[int], n_warm: int, seed: int
                      ) -> tuple[list[list[Any]], list[Any], dict[str, Any]]:
    """(one prompt list per set, warm-up prompts, what the record says of them). Code prompts are
    unseen function heads, fresh in every set; chat prompts (244 in all) are consecutive windows
    of one shuffled pool, wrapping around when a run needs more (the record counts the repeats)."""
    if kind == "code":
        from unseen_prompts import build_prompts, describe

        pool = build_prompts(sum(set_sizes) + n_warm, seed=seed)
        starts = [sum(set_sizes[:i]) for i in range(len(set_sizes))]
        sets = [[p.text for p in pool[a:a + n]] for a, n in zip(starts, set_sizes)]
        return sets, [p.text for p in pool[-n_warm:]], {
            **describe(pool, seed), "kind": "code", "ids": [f"{p.path}:{p.lineno}" for p in pool]}
    from chat_prompts import chat_pool, describe as describe_chat, prompt_sets, seen_before

    pool = chat_pool(seed)
    warmup, rest = pool[-n_warm:], pool[:-n_warm]
    sets, repeats = prompt_sets(rest, set_sizes)
    if repeats:
        _log(f"warning: {repeats} of {sum(set_sizes)} chat prompts repeat earlier ones (the pool has {len(rest)}); "
             "drafters that learn from served outputs (vLLM suffix, lookup-online) draft those from their "
             "earlier answers, a greedy repeat word for word. Per set: record prompts.seen_before")
    return sets, warmup, {**describe_chat(pool, seed), "repeated_prompts": repeats, "seen_before": seen_before(sets),
                          "ids": [[p.id for p in s] for s in sets]}


def prompts_digest(kind: str, prompts: Sequence[Any]) -> str:
    if kind == "code":
        from unseen_prompts import prompts_sha256

        return prompts_sha256(list(prompts))
    from chat_prompts import prompts_sha256 as chat_sha256

    return chat_sha256(prompts)


def main(argv: list[str] | None = None) -> int:
    from bench_serving import resolve_model
    from treespec_fixtures.prebuild import prebuild_engine_fixtures
    from harness.report import hardware_info, hardware_line, software_info
    from harness.forward_clock import clock_env, new_clock, read_slots, slot_deltas
    from harness.serving import CPU_SERVE_ARGS, pin_frontend, run_load, scrape_spec_metrics, serve

    ns = parse_args(argv)
    configs: list[MatrixConfig] = ns.matrix_configs
    labels = [c.label for c in configs]
    cells_spec = regimes(ns.temperatures, ns.concurrency)
    base_args = matrix_serve_args(CPU_SERVE_ARGS, ns.dtype)

    need = SERVER_GIB * len(configs)
    avail = mem_available_gib()
    if avail is not None and avail < need:
        _log(f"error: {len(configs)} servers need about {need:.1f} GiB, only {avail:.1f} GiB available; "
             "serve fewer --configs or free memory")
        return 2

    label, model_dir, meta = resolve_model(ns)
    for c in configs:               # fixtures (tries, draft models) here, before any server starts
        if c.kind == "treespec":
            prebuild_engine_fixtures(c.engine_kwargs, model_dir)
    hw = hardware_info()
    _log(hardware_line(hw))

    # one prompt set per (round, cell), sized for its concurrency (--shared-prompts: one set,
    # each cell taking its first prompts); --fresh-servers: each round's sets drawn for servers
    # that have served nothing yet, from the pool shuffled by seed + round
    round_sizes = [ns.prompts_for[r.concurrency] for r in cells_spec]
    n_warm = max(ns.concurrency)
    kind = prompt_kind(ns.prompts, model_dir)
    ignore_eos = ns.ignore_eos == "yes" or (ns.ignore_eos == "auto" and kind == "code")
    temps = sorted(set(ns.temperatures), key=list(ns.temperatures).index)
    lives_per_round = len(temps) if ns.fresh_servers == "temperature" else 1
    lifetimes = prompt_lifetimes(round_sizes, ns.rounds, shared=ns.shared_prompts, fresh_servers=ns.fresh_servers,
                                 lives_per_round=lives_per_round)
    _log(f"building {sum(map(sum, lifetimes)) + n_warm * len(lifetimes)} {kind} prompts ...")
    built = [build_prompt_sets(kind, sizes, n_warm, ns.seed + i) for i, sizes in enumerate(lifetimes)]
    sets = [one for b in built for one in b[0]]
    warmups = [b[1] for b in built]
    prompts_record = (built[0][2] if len(built) == 1
                      else {"lifetimes": [b[2] for b in built], "seeds": [ns.seed + i for i in range(len(built))]})
    n_sets = len(sets)
    turns_total = ns.rounds * len(configs) * sum(
        len(batches(ns.prompts_for[r.concurrency], r.concurrency, ns.waves_for[r.concurrency])) for r in cells_spec)
    _log(f"{len(configs)} configs x {len(cells_spec)} regimes x {ns.rounds} round(s): {turns_total} turns, "
         f"{_prompts_line(ns)} x {ns.max_tokens} tokens per cell"
         + (f", servers restarted every {ns.fresh_servers}" if ns.fresh_servers else ""))

    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.monotonic()
    samples: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}    # (round, regime) -> label -> sample
    servers_info: list[dict[str, Any]] = []
    turn = 0
    own_cores = os.sched_getaffinity(0)     # what servers start with (--pin-frontend narrows ours later)

    @contextmanager
    def fleet(life: int, temperatures: Sequence[float]) -> Iterator[tuple[list[Any], list[Any]]]:
        """Every config's server started one after the other (never two startups at once) and
        warmed up on this lifetime's warm-up prompts; stopped on exit."""
        with ExitStack() as stack:
            if ns.pin_frontend:     # servers inherit this process's cores: give them all back first
                os.sched_setaffinity(0, own_cores)
            clock_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_matrix_clock_")))
            servers: list[Any] = [None] * len(configs)
            clocks: list[Any] = [None] * len(configs)
            infos: list[dict[str, Any]] = [{} for _ in configs]
            for position, j in enumerate(start_order(len(configs), life, ns.start_order)):
                c = configs[j]
                _log(f"[{c.label}] starting server ...")
                t0 = time.monotonic()
                clocks[j] = new_clock(clock_dir / f"forward_{j}.bin")
                servers[j] = stack.enter_context(serve(model_dir, c.args, base_args=base_args,
                                                       env=clock_env(clocks[j])))
                infos[j] = {"spec": c.spec, "label": c.label, "args": list(c.args), "start_position": position,
                            "startup_s": round(time.monotonic() - t0, 1), "dtype": server_dtype(servers[j])}
                if ns.fresh_servers:
                    infos[j]["round"] = life
                if ns.pin_frontend:
                    infos[j]["cores"] = pin_frontend(servers[j])
            if ns.pin_frontend:     # the client too, once every server has started with all cores
                os.sched_setaffinity(0, infos[0]["cores"]["frontend"])
            for s, info in zip(servers, infos):
                for t in sorted(set(temperatures)):
                    run_load(s, warmups[min(life, len(warmups) - 1)], max_tokens=WARMUP_MAX_TOKENS,
                             concurrency=n_warm, temperature=t, ignore_eos=ignore_eos)
                time.sleep(ns.idle_gap)
                info["rss_mib_after_warmup"] = server_rss_mib(s)
            _log("servers: " + ", ".join(f"{i['label']} {i['dtype']} {i['rss_mib_after_warmup']} MiB"
                                         for i in infos))
            servers_info.extend(infos)
            yield servers, clocks

    def run_round(rnd: int, servers: list[Any], clocks: list[Any], temperatures: Sequence[float]) -> None:
        nonlocal turn
        off = servers[0]
        for ci, reg in enumerate(cells_spec):
            if reg.temperature not in temperatures:
                continue
            prompts = (sets[0][:ns.prompts_for[reg.concurrency]] if ns.shared_prompts
                       else sets[rnd * len(cells_spec) + ci])
            before = [scrape_spec_metrics(s) for s in servers]
            time.sleep(ns.idle_gap)
            outputs: list[list[Any]] = [[None] * len(prompts) for _ in configs]
            prompt_ids: list[Any] = [None] * len(prompts)
            secs: list[list[float]] = [[] for _ in configs]
            fwd: list[list[float]] = [[] for _ in configs]
            turn_parts: list[list[dict[str, list[float]]]] = [[] for _ in configs]
            turn_toks: list[list[int]] = [[] for _ in configs]
            steady: list[list[tuple[int, float] | None]] = [[] for _ in configs]
            toks = [0] * len(configs)
            for batch in batches(len(prompts), reg.concurrency, ns.waves_for[reg.concurrency]):
                for j in turn_order(len(configs), turn):
                    clock_before = read_slots(clocks[j])
                    load = run_load(servers[j], [prompts[i] for i in batch], max_tokens=ns.max_tokens,
                                    concurrency=reg.concurrency, temperature=reg.temperature,
                                    ignore_eos=ignore_eos, stream=ns.stream)
                    secs[j].append(load.wall_s)
                    steady[j].append(load.steady())
                    parts = slot_deltas(read_slots(clocks[j]), clock_before)
                    fwd[j].append(parts["forward"][0])
                    turn_parts[j].append({k: [round(v[0], 6), v[1]] for k, v in parts.items()})
                    turn_toks[j].append(load.output_tokens)
                    toks[j] += load.output_tokens
                    for i, r in zip(batch, load.requests):
                        outputs[j][i] = r.token_ids
                        if j == 0:
                            prompt_ids[i] = r.prompt_token_ids
                    time.sleep(ns.idle_gap)
                turn += 1
            deltas = [scrape_spec_metrics(s) - b for s, b in zip(servers, before)]
            cell: dict[str, dict[str, Any]] = {}
            for j, c in enumerate(configs):
                d = deltas[j]
                entry = {"output_tokens": toks[j], "seconds": sum(secs[j]), "turn_seconds": secs[j],
                         "turn_forward_seconds": fwd[j],
                         "turn_parts": turn_parts[j],
                         "turn_tokens": turn_toks[j],
                         "turn_steady": [None if x is None else [x[0], round(x[1], 4)] for x in steady[j]],
                         "tau": d.tau, "acceptance_rate": d.acceptance_rate,
                         "drafts": d.drafts if d.present else None,
                         "draft_tokens": d.draft_tokens if d.present else None,
                         "accepted_tokens": d.accepted if d.present else None,
                         "prompts_sha256": prompts_digest(kind, prompts)}
                if reg.greedy and j > 0:
                    equal = sum(a == b for a, b in zip(outputs[j], outputs[0]))
                    entry["equal"] = [equal, len(prompts)]
                    entry["mismatches"] = [
                        {"prompt_index": i, **explain_mismatch(off, prompts[i], outputs[0][i], outputs[j][i],
                                                         prompt_ids[i])}
                        for i in range(len(prompts)) if outputs[j][i] != outputs[0][i]]
                cell[c.label] = entry
            if any(e.get("mismatches") for e in cell.values()):
                time.sleep(ns.idle_gap)
            samples[(rnd, reg.label)] = cell
            base = cell[BASELINE]["output_tokens"] / max(cell[BASELINE]["seconds"], 1e-9)
            parts = [f"off {base:.1f} tok/s"]
            for c in configs[1:]:
                e = cell[c.label]
                paired = paired_ratio(_turns(e, cell[BASELINE]))
                corrected = paired_corrected_ratio(_corrected_turns(e, cell[BASELINE]))
                steady_paired = paired_ratio(_steady_turns(e, cell[BASELINE]))
                parts.append(f"{c.label} {paired:.2f}x"
                             + (f" (steady {steady_paired:.2f}x)" if steady_paired is not None else "")
                             + (f" (corrected {corrected:.3f})" if corrected is not None else "")
                             + (f" tau {e['tau']:.2f}" if e["tau"] is not None else "")
                             + (f" eq {e['equal'][0]}/{e['equal'][1]}" if "equal" in e else ""))
            _log(f"[round {rnd + 1}/{ns.rounds}] {reg.label}: " + " | ".join(parts))

    if ns.fresh_servers:
        life = 0
        for rnd in range(ns.rounds):
            for life_temps in ([[t] for t in temps] if lives_per_round > 1 else [temps]):
                with fleet(life, life_temps) as (servers, clocks):
                    run_round(rnd, servers, clocks, life_temps)
                life += 1
    else:
        with fleet(0, temps) as (servers, clocks):
            for rnd in range(ns.rounds):
                run_round(rnd, servers, clocks, temps)
    wall = time.monotonic() - t_start

    cells = []
    for reg in cells_spec:
        per_round = [samples[(r, reg.label)] for r in range(ns.rounds)]
        summary = summarize_cell([{lb: (e["output_tokens"], e["seconds"]) for lb, e in pr.items()} for pr in per_round])
        for lb in labels:
            rows = [pr[lb] for pr in per_round]
            s = summary[lb]
            if lb != BASELINE:
                s["ratio_pooled_median_round"] = s["ratio"]
                pairs = list(zip(rows, (pr[BASELINE] for pr in per_round)))
                raw_turns = [t for e, b in pairs for t in _turns(e, b)]
                s["ratio"] = paired_ratio(raw_turns)
                s["ratio_interval"] = interval_entry(turn_ratios(raw_turns))
                corrected = [t for e, b in pairs for t in _corrected_turns(e, b)]
                s["ratio_drift_corrected"] = paired_corrected_ratio(corrected)
                s["ratio_drift_corrected_interval"] = interval_entry(corrected_turn_ratios(corrected))
                s["ratio_drift_corrected_summed"] = summed_corrected_ratio(corrected)
                steady_turns = [t for e, b in pairs for t in _steady_turns(e, b)]
                s["ratio_steady"] = paired_ratio(steady_turns)
                s["ratio_steady_interval"] = interval_entry(turn_ratios(steady_turns))
            s["parts"] = parts_summary(rows)
            s["tau"] = pooled_tau([(e["drafts"], e["accepted_tokens"]) for e in rows if e["drafts"] is not None])
            s["tau_rounds"] = [e["tau"] for e in rows]
            s["tau_bound"] = tau_bound([(e["drafts"], e["output_tokens"]) for e in rows if e["drafts"] is not None])
            s["acceptance_rate_rounds"] = [e["acceptance_rate"] for e in rows]
            if reg.greedy and lb != BASELINE:
                s["equal"] = [sum(e["equal"][0] for e in rows), sum(e["equal"][1] for e in rows)]
                s["mismatches"] = [{"round": r, **m} for r, e in enumerate(rows) for m in e["mismatches"]]
            s["rounds"] = [{k: v for k, v in e.items() if k != "mismatches"} for e in rows]
        cells.append({"regime": reg.label, "temperature": reg.temperature, "concurrency": reg.concurrency,
                      "num_prompts": ns.prompts_for[reg.concurrency],
                      "batch_size": batch_size(ns.prompts_for[reg.concurrency], reg.concurrency,
                                               ns.waves_for[reg.concurrency]), "configs": summary})

    spec_labels = labels[1:]
    ratio_md = markdown_table(cells, spec_labels)
    interval_md = interval_table(cells, spec_labels)
    steady_md = interval_table(cells, spec_labels, key="ratio_steady") if ns.stream else None
    tau_md = markdown_table(cells, spec_labels, key="tau", fmt="{:.2f}")
    corrected_md = markdown_table(cells, spec_labels, key="ratio_drift_corrected", fmt="{:.3f}")
    parts_md = parts_table(cells, labels)
    mismatches = [(c["regime"], lb, m) for c in cells for lb in spec_labels
                  for m in c["configs"][lb].get("mismatches", [])]
    record = {
        "benchmark": "bench_matrix",
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(wall, 1),
        "hardware": hw,
        "software": {**software_info(), **_extra_versions(configs)},
        "model": {"dir_name": model_dir.name, "label": label, "fixture": meta},
        "serve_args": list(base_args),
        "servers": servers_info,
        "settings": {"configs": [c.spec for c in configs],
                     "num_prompts": _one_or_per_concurrency(ns.prompts_for),
                     "max_tokens": ns.max_tokens, "concurrencies": ns.concurrency,
                     "temperatures": ns.temperatures, "rounds": ns.rounds, "idle_gap_s": ns.idle_gap,
                     "pin_frontend": ns.pin_frontend, "stream": ns.stream,
                     "seed": ns.seed, "shared_prompts": ns.shared_prompts, "fresh_servers": ns.fresh_servers,
                     "start_order": ns.start_order,
                     "ignore_eos": ignore_eos,
                     "waves": _one_or_per_concurrency(ns.waves_for),
                     "batch_rule": "max(8, waves x concurrency), at most num_prompts; order rotates by one per batch",
                     "warmup": {"prompts": n_warm, "max_tokens": WARMUP_MAX_TOKENS,
                                "temperatures": sorted(set(ns.temperatures))},
                     "turns": turns_total,
                     "median": "ratio: lower middle over the cell's batches (all rounds) of the config's "
                               "tokens/s over off's in the same batch; ratio_rounds: each round's pooled "
                               "ratio; ratio_pooled_median_round: their lower middle",
                     "drift_corrected": "ratio_drift_corrected: the same median with each turn's seconds "
                                        "divided by the server's own model-forward seconds in that turn "
                                        "(harness/forward_clock.py); _summed: of the cell's sums",
                     "parts": "per cell and config, every turn's seconds in each step part (worker "
                              "execute/sample, engine core schedule/update/step/post-step, API server "
                              "output processing; harness/forward_clock.py) per second of the same "
                              "server's forward and per output token"},
        "prompts": {**prompts_record, "sets": n_sets, "warmup_prompts": n_warm},
        "cells": cells,
        "ratio_table_markdown": ratio_md,
        "ratio_interval_table_markdown": interval_md,
        "steady_interval_table_markdown": steady_md,
        "tau_table_markdown": tau_md,
        "drift_corrected_table_markdown": corrected_md,
        "parts_table_markdown": parts_md,
    }
    out = ns.output or RESULTS_DIR / f"bench_matrix_{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    png = plot_heatmap(cells, spec_labels, out.with_suffix(".png"),
                       f"bench_matrix, {model_dir.name}, {_prompts_line(ns)} x {ns.max_tokens} tokens, "
                       f"{ns.rounds} round(s)\n{hardware_line(hw)}")

    print(f"\nspeedup vs off (median over batches of paired tokens/s ratios, {ns.rounds} round(s)); "
          f"model {model_dir.name}, "
          f"{_prompts_line(ns)} ({kind}) x {ns.max_tokens} tokens per cell\n")
    print(ratio_md)
    print("\nraw ratio with its 90% bootstrap interval over the cell's paired turns\n")
    print(interval_md)
    if steady_md:
        print("\nsteady raw ratio (tokens/s while every client had a request in flight: the turn "
              "without its drain) with its 90% bootstrap interval\n")
        print(steady_md)
    print("\ndrift-corrected (each turn's seconds over its own forward seconds; valid where both sides "
          "verify about the same rows)\n")
    print(corrected_md)
    print("\nstep parts, seconds per second of each server's own forward (all rounds)\n")
    print(parts_md)
    print("\ntau (tokens per drafted step, pooled over rounds)\n")
    print(tau_md)
    eq = [f"{c['regime']} {lb} {c['configs'][lb]['equal'][0]}/{c['configs'][lb]['equal'][1]}"
          for c in cells if c["temperature"] == 0 for lb in spec_labels]
    if eq:
        print("\ngreedy outputs equal to off: " + ", ".join(eq))
    if mismatches:
        gaps = [m.get("off_minus_spec") for _, _, m in mismatches if m.get("off_minus_spec") is not None]
        print(f"{len(mismatches)} greedy mismatch(es); off's logprob lead over the diverging token at the first "
              f"difference: " + (f"median {statistics.median(gaps):.4f}, max {max(gaps):.4f} nats" if gaps else "n/a"))
    print(f"\nwall {wall / 60:.1f} min; wrote {out} and {png.name}")
    return 0


def _turns(entry: dict[str, Any], off: dict[str, Any]) -> list[tuple[int, float, int, float]]:
    """(tokens, seconds, off tokens, off seconds) per batch of one cell round."""
    return list(zip(entry["turn_tokens"], entry["turn_seconds"], off["turn_tokens"], off["turn_seconds"]))


def _steady_turns(entry: dict[str, Any], off: dict[str, Any]) -> list[tuple[int, float, int, float]]:
    """(steady tokens, steady seconds, off's) per batch of one cell round (`LoadResult.steady`:
    the part of a turn in which every client had a request in flight); empty for records whose
    answers were not streamed."""
    pairs = zip(entry.get("turn_steady") or [], off.get("turn_steady") or [])
    return [(a[0], a[1], b[0], b[1]) for a, b in pairs if a is not None and b is not None]


def _corrected_turns(entry: dict[str, Any], off: dict[str, Any]
                     ) -> list[tuple[int, float, float, int, float, float]]:
    """(tokens, seconds, forward seconds, off tokens, off seconds, off forward seconds) per batch
    of one cell round; empty for records without forward seconds."""
    if "turn_forward_seconds" not in entry or "turn_forward_seconds" not in off:
        return []
    return list(zip(entry["turn_tokens"], entry["turn_seconds"], entry["turn_forward_seconds"],
                    off["turn_tokens"], off["turn_seconds"], off["turn_forward_seconds"]))


def _extra_versions(configs: Sequence[MatrixConfig]) -> dict[str, str | None]:
    if not any(c.kind == "suffix" for c in configs):
        return {}
    from importlib import metadata

    try:
        return {"arctic_inference": metadata.version("arctic-inference")}
    except metadata.PackageNotFoundError:
        return {"arctic_inference": None}


def plot_heatmap(cells: Sequence[dict[str, Any]], labels: Sequence[str], path: Path, title: str) -> Path:
    """Ratios to off: config rows x regime columns, colour diverging around 1.0 (log scale, red
    slower, green faster), each cell annotated with its ratio and tau."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.full((len(labels), len(cells)), np.nan)
    for j, c in enumerate(cells):
        for i, lb in enumerate(labels):
            r = c["configs"].get(lb, {}).get("ratio")
            if r:
                grid[i, j] = math.log2(r)
    lim = max(0.25, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 0.25)
    fig, ax = plt.subplots(figsize=(1.25 * len(cells) + 3, 0.65 * len(labels) + 2))
    im = ax.imshow(grid, cmap="RdYlGn", vmin=-lim, vmax=lim, aspect="auto")
    for j, c in enumerate(cells):
        for i, lb in enumerate(labels):
            e = c["configs"].get(lb, {})
            if e.get("ratio") is None:
                continue
            text = (f"{e['ratio']:.2f}x"
                    + (f"\ncorr {e['ratio_drift_corrected']:.3f}" if e.get("ratio_drift_corrected") else "")
                    + (f"\ntau {e['tau']:.2f}" if e.get("tau") is not None else ""))
            ax.text(j, i, text, ha="center", va="center", fontsize=7.5)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c["regime"] for c in cells], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    cbar = fig.colorbar(im, ax=ax)
    ticks = [t for t in (-2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2) if abs(t) <= lim]
    cbar.set_ticks(ticks)
    cbar.set_ticklabels([f"{2 ** t:.2g}x" for t in ticks])
    cbar.set_label("tokens/s vs off", fontsize=8)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
