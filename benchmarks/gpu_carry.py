"""Collect what the device script needs from this machine into one folder that travels with a
device call: the code-LM fixture (weights, config, tokenizer), its distilled lookup trie, and
prompts already tokenized (unseen third-party code, `unseen_prompts.py`), so the GPU machine
needs neither the fixture builders nor site-packages to draw prompts from.

    python benchmarks/gpu_carry.py .gpu_carry        # then carry .gpu_carry (git-excluded)

The fixtures are built (or read from the cache) exactly as the tests get them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "fixture.json")


def copy_model(src: Path, dst: Path) -> None:
    """The files a torch re-implementation and the trie's tokenizer check read."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def tokenized_prompts(model_dir: Path, num: int, seed: int) -> dict:
    """``{"source": ..., "prompts": [[token ids], ...]}`` for `num` unseen function heads."""
    from transformers import AutoTokenizer

    from unseen_prompts import build_prompts, describe, prompts_sha256

    prompts = build_prompts(num, seed=seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [p.text for p in prompts]
    return {"source": describe(prompts, seed), "sha256": prompts_sha256(texts),
            "prompts": [tok(t)["input_ids"] for t in texts]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest", type=Path)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--seed", type=int, default=11)
    ns = p.parse_args(argv)
    from treespec_fixtures import build_fixture
    from treespec_fixtures.tries import build_trie_fixture

    model = Path(build_fixture("code-lm"))
    trie = Path(build_trie_fixture("code-lm-distill-5gram", model))
    copy_model(model, ns.dest / "code-lm")
    shutil.copy2(trie, ns.dest / "code-lm-distill-5gram.trie")
    record = tokenized_prompts(model, ns.num_prompts, ns.seed)
    (ns.dest / "prompts.json").write_text(json.dumps(record) + "\n")
    size = sum(f.stat().st_size for f in ns.dest.rglob("*") if f.is_file())
    print(f"wrote {ns.dest} ({size / 2**20:.1f} MiB, {len(record['prompts'])} prompts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
