"""`vllm-treespec train {data,dart,jetspec,trie}`: regenerate training data with the target, train a
DART or JetSpec head (the diffusion-style head is `train jetspec --within-block bidirectional`),
or count the target's own continuations into a drafter trie (train/distill_trie.py).

    vllm-treespec train data MODEL_DIR --out data/code --num-prompts 256 --max-tokens 128
    vllm-treespec train dart MODEL_DIR --data data/code --out heads/dart --steps 600
    vllm-treespec train jetspec MODEL_DIR --data data/code --out heads/jetspec --steps 600
    vllm-treespec train trie MODEL_DIR --out model.trie --prompts prompts.jsonl --order 5

MODEL_DIR may also be a prefixed path a registered resolver gives (vllm_treespec/paths.py), such
as the source checkout's `fixture:code-lm`. Without --prompts, prompts are cut from the Python
standard library's training split (train/corpus.py).

`train data` writes shards plus data.json (target, feature layers, top-K, prompts recipe);
`train dart|jetspec` reads them, holds out every tenth sequence (at least one) for evaluation,
resumes from --out's training state when it exists, and writes the head checkpoint (config.json,
model.safetensors, head.json with the recipe and the held-out per-depth accuracy / hit@10).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


def add_subcommands(subparsers: Any) -> None:
    tr = subparsers.add_parser("train", help="draft-head training: data generation and recipes")
    sub = tr.add_subparsers(dest="train_command", required=True)
    d = sub.add_parser("data", help="regenerate continuations with the target; save features + top-K")
    d.add_argument("model", help="target model directory (or a registered prefixed path)")
    d.add_argument("--out", required=True, type=Path, help="output directory for shards")
    d.add_argument("--num-prompts", type=int, default=256)
    d.add_argument("--prompt-chars", type=int, default=600)
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument("--topk", type=int, default=16, help="teacher top-K kept per position")
    d.add_argument("--layers", type=int, nargs="+", default=None,
                   help="target layers (0-based outputs) to read; default EAGLE-3's 1, L/2-1, L-4")
    d.add_argument("--temperature", type=float, default=0.0)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_data)
    tt = sub.add_parser("trie", help="count the target's own continuations into an n-gram trie "
                                     "(a self-distilled drafter trie)")
    tt.add_argument("model", help="target model directory (or a registered prefixed path)")
    tt.add_argument("--out", required=True, type=Path, help="output trie file")
    tt.add_argument("--prompts", type=Path, default=None, metavar="JSONL",
                    help="prompts like the served traffic: one JSON string or {\"prompt\": ...} per line "
                         "(default: --num-prompts prompts from the Python stdlib's training split)")
    tt.add_argument("--num-prompts", type=int, default=2048, help="corpus prompts without --prompts")
    tt.add_argument("--prompt-chars", type=int, default=600, help="corpus prompt length without --prompts")
    tt.add_argument("--max-tokens", type=int, default=128, help="continuation tokens per prompt")
    tt.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (match the served sampling)")
    tt.add_argument("--samples-per-prompt", type=int, default=1,
                    help="continuations drawn per prompt (> 1 needs --temperature > 0)")
    tt.add_argument("--seed", type=int, default=0)
    tt.add_argument("--order", type=int, default=5, help="n: longest n-gram kept")
    tt.add_argument("--min-count", type=int, default=1, help="drop n-grams (n >= 2) seen fewer times")
    tt.add_argument("--context", type=int, default=4,
                    help="prompt tokens kept before each continuation (its first n-grams' context)")
    tt.add_argument("--max-model-len", type=int, default=2048)
    tt.add_argument("--dtype", default="auto", help="generation dtype (default: the served one, auto)")
    tt.add_argument("--report", type=Path, default=None, help="also write the build report (JSON) here")
    tt.set_defaults(func=cmd_trie)
    for kind, about in (("dart", "train a DART head (prefix-shared mask, annealed KL)"),
                        ("jetspec", "train a JetSpec head (random anchors, block mask, forward KL at T)")):
        t = sub.add_parser(kind, help=f"{about} on shards from `train data`")
        t.add_argument("model", help="the target (its embedding is shared; shapes are checked)")
        t.add_argument("--data", required=True, type=Path)
        t.add_argument("--out", required=True, type=Path)
        t.add_argument("--depth", type=int, default=8, help="tokens predicted per forward (d)")
        t.add_argument("--steps", type=int, default=600)
        t.add_argument("--batch-size", type=int, default=8)
        t.add_argument("--window", type=int, default=64 if kind == "dart" else 512,
                       help="rows per training window; serving hands a head whole sequences, and a "
                            "JetSpec head trained on short windows loses accuracy on long ones")
        t.add_argument("--lr", type=float, default=1e-3)
        t.add_argument("--seed", type=int, default=0)
        t.add_argument("--within-block", choices=["causal", "bidirectional"], default="causal",
                       help="attention among the block's rows (bidirectional = diffusion-style head)")
        t.add_argument("--intermediate-size", type=int, default=None,
                       help="the head's MLP width (default: the target's); a head's serving cost "
                            "follows its weight bytes, so narrower heads draft faster")
        if kind == "dart":
            t.add_argument("--gamma", type=float, default=0.6, help="per-depth KL annealing")
        else:
            t.add_argument("--anchors", type=int, default=16, help="random anchors per window per step")
            t.add_argument("--temperature", type=float, default=1.0, help="distillation temperature T")
            t.add_argument("--num-layers", type=int, default=2, help="draft decoder layers")
        t.add_argument("--no-resume", action="store_true")
        t.add_argument("--quiet", action="store_true", help="no progress bar")
        t.set_defaults(func=cmd_train, kind=kind)


def _model_dir(spec: str) -> Path:
    from vllm_treespec.drafters.lm.loading import resolve_model_dir

    return resolve_model_dir(spec)


def cmd_data(ns: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from vllm_treespec.drafters.heads.dart import eagle3_layers
    from vllm_treespec.train.corpus import training_prompts
    from vllm_treespec.train.data import generate_shards

    model = _model_dir(ns.model)
    layers = ns.layers or list(eagle3_layers(AutoConfig.from_pretrained(str(model)).num_hidden_layers))
    prompts = training_prompts(ns.num_prompts, ns.prompt_chars, seed=ns.seed)
    paths = generate_shards(model, prompts, ns.out, feature_layers=layers, max_tokens=ns.max_tokens,
                            topk=ns.topk, temperature=ns.temperature, seed=ns.seed,
                            engine={"dtype": "float32", "max_model_len": 2048})
    manifest = {"model": str(model), "feature_layers": layers, "topk": ns.topk,
                "max_tokens": ns.max_tokens, "temperature": ns.temperature,
                "prompts": {"source": "vllm_treespec.train.corpus.training_prompts",
                            "count": ns.num_prompts, "prompt_chars": ns.prompt_chars, "seed": ns.seed},
                "shards": [p.name for p in paths]}
    (ns.out / "data.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(ns.out)
    return 0


def cmd_trie(ns: argparse.Namespace) -> int:
    from vllm_treespec.train.corpus import training_prompts
    from vllm_treespec.train.distill_trie import build_distilled_trie, read_prompts

    for flag, value, low in (("--num-prompts", ns.num_prompts, 1), ("--max-tokens", ns.max_tokens, 1),
                             ("--order", ns.order, 1), ("--min-count", ns.min_count, 1),
                             ("--context", ns.context, 0),
                             ("--samples-per-prompt", ns.samples_per_prompt, 1)):
        if value < low:
            print(f"error: {flag} must be >= {low}, got {value}", file=sys.stderr)
            return 2
    if ns.samples_per_prompt > 1 and ns.temperature <= 0:
        print(f"error: --samples-per-prompt {ns.samples_per_prompt} needs --temperature > 0 "
              "(greedy continuations of one prompt are all the same)", file=sys.stderr)
        return 2
    try:
        prompts = (read_prompts(ns.prompts) if ns.prompts is not None
                   else training_prompts(ns.num_prompts, ns.prompt_chars, seed=ns.seed))
    except (OSError, ValueError) as e:
        print(f"error: --prompts: {e}", file=sys.stderr)
        return 2
    report = build_distilled_trie(
        _model_dir(ns.model), prompts, ns.out, max_tokens=ns.max_tokens, temperature=ns.temperature,
        seed=ns.seed, order=ns.order, min_count=ns.min_count, context=ns.context,
        engine={"dtype": ns.dtype, "max_model_len": ns.max_model_len},
        samples_per_prompt=ns.samples_per_prompt)
    report["prompts_source"] = str(ns.prompts) if ns.prompts is not None else (
        f"vllm_treespec.train.corpus.training_prompts({ns.num_prompts}, {ns.prompt_chars}, seed={ns.seed})")
    text = json.dumps(report, indent=2, default=str)
    if ns.report is not None:
        ns.report.write_text(text + "\n")
    print(text)
    return 0


def make_recipe(ns: argparse.Namespace) -> Any:
    """The recipe dataclass of `train dart|jetspec` from its flags."""
    common = dict(steps=ns.steps, batch_size=ns.batch_size, window=ns.window, lr=ns.lr, seed=ns.seed)
    if ns.kind == "dart":
        from vllm_treespec.train.dart_recipe import DartRecipe

        return DartRecipe(gamma=ns.gamma, **common)
    from vllm_treespec.train.jetspec_recipe import JetSpecRecipe

    return JetSpecRecipe(anchors=ns.anchors, temperature=ns.temperature, **common)


def cmd_train(ns: argparse.Namespace) -> int:
    if not (ns.data / "data.json").is_file():
        print(f"train {ns.kind}: {ns.data / 'data.json'} not found; run `vllm-treespec train data` first",
              file=sys.stderr)
        return 2
    try:
        recipe = make_recipe(ns)
        shape = {"num_layers": ns.num_layers} if ns.kind == "jetspec" else {}
        if ns.intermediate_size is not None:
            shape["intermediate_size"] = ns.intermediate_size
        metrics = train_head(_model_dir(ns.model), ns.data, ns.out, recipe, kind=ns.kind, depth=ns.depth,
                             within_block=ns.within_block, resume=not ns.no_resume, progress=not ns.quiet,
                             **shape)
    except ValueError as e:
        print(f"train {ns.kind}: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(ns.out), **metrics}))
    return 0


def held_out_mask(num_sequences: int) -> Any:
    """bool [S]: the evaluation sequences (every tenth, at least one; the rest train)."""
    import torch

    if num_sequences < 2:
        raise ValueError("need at least 2 sequences (one is held out for evaluation)")
    held = torch.arange(num_sequences) % 10 == 9
    if not bool(held.any()):
        held[-1] = True
    return held


def train_head(model_dir: Path, data_dir: Path, out_dir: Path, recipe: Any, *, kind: str = "dart",
               depth: int = 8, within_block: str = "causal", resume: bool = True, progress: bool = True,
               **shape: Any) -> dict:
    """Train a `kind` head (dart, jetspec) for the target in model_dir on data_dir's shards; write the
    checkpoint to out_dir and return its held-out per-depth metrics (also saved in head.json).
    The head's attention shape copies the target's; ``shape`` overrides config fields."""
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.heads import HEAD_KINDS
    from vllm_treespec.drafters.heads.checkpoint import save_head
    from vllm_treespec.drafters.parallel_head import target_embedding
    from vllm_treespec.train.loop import evaluate_head
    from vllm_treespec.train.shards import SequenceWindows, load_shards

    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; choose one of {', '.join(HEAD_KINDS)}")
    manifest = json.loads((data_dir / "data.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tc = target.config
    embed = target_embedding(target)            # shares the target's storage; the rest is freed
    del target
    config_cls, head_cls = HEAD_KINDS[kind]
    from_target = dict(num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads,
                       head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
                       intermediate_size=tc.intermediate_size, rope_theta=float(getattr(tc, "rope_theta", 1e6)))
    config = config_cls(hidden_size=tc.hidden_size, vocab_size=tc.vocab_size,
                        target_num_layers=tc.num_hidden_layers,
                        feature_layers=tuple(manifest["feature_layers"]), depth=depth,
                        within_block=within_block, **{**from_target, **shape})
    data = load_shards([data_dir / s for s in manifest["shards"]])
    held = held_out_mask(data.num_sequences)
    torch.manual_seed(recipe.seed)
    head = head_cls(config, embed)
    windows = SequenceWindows(data.subset(~held), recipe.window)
    if kind == "dart":
        from vllm_treespec.train.dart_recipe import train_dart as train
    else:
        from vllm_treespec.train.jetspec_recipe import train_jetspec as train
    losses = train(head, windows, recipe, out_dir, resume=resume, progress=progress)
    metrics = evaluate_head(head, SequenceWindows(data.subset(held), recipe.window))
    save_head(head, out_dir, extra={"recipe": asdict(recipe), "data": manifest, "held_out": metrics,
                                    "final_loss": losses[-1] if losses else None})
    return metrics
