"""Run jobs on a GGUF with llama-cpp-python, in an interpreter that has it (check_smollm2.py).

llama-cpp-python builds llama.cpp from source (minutes on 2 cores) and pins its own numpy, so it
lives in a venv of its own; this script is the only code that runs there. It reads one JSON job
on stdin and writes one JSON answer on stdout:

    {"gguf": PATH, "threads": 2, "tokenize": [TEXT...], "generate": [[IDS...]...], "max_tokens": N,
     "score": [[IDS...]...]}
    -> {"tokenize": [[IDS...]...], "generate": [[IDS...]...], "score": [[[NLL, ARGMAX]...]...]}

`generate` is greedy from token-id prompts (argmax of llama.cpp's logits, stopping at EOS);
`score` gives, per window, each next token's negative log-likelihood and llama.cpp's argmax
after each prefix (teacher forcing).
"""
from __future__ import annotations

import json
import sys


def main() -> int:
    import numpy as np
    from llama_cpp import Llama

    job = json.load(sys.stdin)
    llm = Llama(job["gguf"], n_ctx=int(job.get("n_ctx", 2048)), n_threads=int(job.get("threads", 2)),
                n_threads_batch=int(job.get("threads", 2)), logits_all=True, verbose=False)
    eos = llm.token_eos()
    out: dict = {"tokenize": [llm.tokenize(t.encode(), add_bos=False, special=True) for t in job.get("tokenize", [])]}
    gens = []
    for ids in job.get("generate", []):
        llm.reset()
        llm.eval(list(ids))
        got = []
        for _ in range(int(job.get("max_tokens", 64))):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            got.append(tok)
            if tok == eos:
                break
            llm.eval([tok])
        gens.append(got)
    out["generate"] = gens
    scores = []
    for ids in job.get("score", []):
        llm.reset()
        llm.eval(list(ids))
        logits = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1)) + logits.max(axis=1)
        nll = logz - logits[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        scores.append([[float(a), int(b)] for a, b in zip(nll, logits.argmax(axis=1))])
    out["score"] = scores
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
