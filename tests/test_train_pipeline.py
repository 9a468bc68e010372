"""`vllm-treespec train data` then `train dart` and `train jetspec` on a fixture target: shards hold
the target's own continuations (regenerated through vLLM) with features and top-K equal to an HF
forward, and the trained checkpoints load against the target with their held-out metrics recorded."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "vllm_treespec.cli", *args], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_data_then_dart(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.heads.checkpoint import load_head
    from vllm_treespec.train.shards import load_shards

    data, out = tmp_path / "data", tmp_path / "head"
    _cli("train", "data", str(tiny_model), "--out", str(data), "--num-prompts", "6", "--prompt-chars", "120",
         "--max-tokens", "12", "--topk", "4")
    manifest = json.loads((data / "data.json").read_text())
    assert manifest["feature_layers"] == [0]              # tiny: 2 layers -> only layer 0's output
    shard = load_shards([data / s for s in manifest["shards"]])
    assert shard.num_sequences == 6
    target = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    a, b = int(shard.seq_offsets[0]), int(shard.seq_offsets[1])
    with torch.no_grad():
        ref = target(input_ids=shard.tokens[a:b][None], output_hidden_states=True)
    torch.testing.assert_close(shard.features[a:b].float(), ref.hidden_states[1][0], atol=2e-2, rtol=1e-2)
    assert torch.equal(shard.topk_ids[a:b, 0], ref.logits[0].argmax(-1))
    # the continuation is the target's own greedy one (vLLM): each generated token is the argmax
    # of the previous position, except where float rounding ties could flip it
    gen = shard.tokens[b - 12:b]
    agree = (ref.logits[0, b - a - 13:b - a - 1].argmax(-1) == gen).float().mean()
    assert agree > 0.9

    printed = _cli("train", "dart", str(tiny_model), "--data", str(data), "--out", str(out), "--depth", "3",
                   "--steps", "6", "--batch-size", "2", "--window", "16", "--quiet")
    metrics = json.loads(printed.strip().splitlines()[-1])
    assert len(metrics["accuracy"]) == 3
    info = json.loads((out / "head.json").read_text())
    assert info["recipe"]["steps"] == 6 and info["held_out"] == {k: metrics[k] for k in ("accuracy", "hit_at_10")}
    head = load_head(out, target.config, target.get_input_embeddings())
    assert head.config.feature_layers == (0,) and head.config.depth == 3

    # the same shards train a diffusion-style JetSpec head through `train jetspec`
    printed = _cli("train", "jetspec", str(tiny_model), "--data", str(data), "--out", str(tmp_path / "js"),
                   "--depth", "3", "--steps", "4", "--batch-size", "2", "--window", "16", "--anchors", "3",
                   "--num-layers", "1", "--intermediate-size", "40", "--within-block", "bidirectional", "--quiet")
    assert len(json.loads(printed.strip().splitlines()[-1])["hit_at_10"]) == 3
    js = load_head(tmp_path / "js", target.config, target.get_input_embeddings(), kind="jetspec")
    assert js.config.within_block == "bidirectional" and js.config.num_layers == 1
    assert js.config.intermediate_size == 40 and js.layers[0].mlp.up_proj.out_features == 40
    assert json.loads((tmp_path / "js" / "head.json").read_text())["recipe"]["anchors"] == 3
