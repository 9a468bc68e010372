"""benchmarks/gpu_loop.py on CPU (Triton interpreter): its Qwen3 forward matches transformers, and
tree speculative decoding through the GPU kernels emits exactly plain greedy decoding's tokens."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from benchmark_modules import load_benchmark

from harness.triton_mode import triton_mode_problem

pytestmark = pytest.mark.skipif(triton_mode_problem() is not None,
                                reason=str(triton_mode_problem()))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def gpu_loop():
    yield load_benchmark("gpu_loop")
    sys.modules.pop("gpu_loop", None)


def test_forward_matches_transformers(gpu_loop, code_lm_model, one_torch_thread) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    prompt = gpu_loop.tokenize_prompts(code_lm_model, [gpu_loop.CODE_PROMPTS[1]])[0][:40]
    model = gpu_loop.load_model(code_lm_model, DEVICE, torch.float32, max_positions=64)
    kv = gpu_loop.new_paged_kv(model, 1, 64)
    ours = gpu_loop.prefill(model, kv, [prompt], all_rows=True).cpu()
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(code_lm_model), dtype=torch.float32)
    with torch.no_grad():
        ref = hf.eval()(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_tree_decoding_equals_plain(gpu_loop, code_lm_model, code_lm_distilled_trie,
                                    one_torch_thread, tmp_path) -> None:
    pytest.importorskip("tokenizers")
    prompts = gpu_loop.tokenize_prompts(code_lm_model, gpu_loop.CODE_PROMPTS[:3])
    prompts = [p[:32] for p in prompts]
    prompt_file = tmp_path / "prompts.json"
    prompt_file.write_text(json.dumps(prompts))
    code = gpu_loop.main(["--device", DEVICE, "--model", str(code_lm_model),
                          "--trie", str(code_lm_distilled_trie), "--prompts", str(prompt_file),
                          "--batch", "3", "--max-new-tokens", "12", "--budget", "8",
                          "--depth", "4", "--warmup", "0", "--modes", "plain", "tree",
                          "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_loop.json").read_text())
    run = report["runs"]["float32"]
    assert "error" not in run["plain"] and "error" not in run["tree"], run
    assert run["tree"]["equal"], run["tree"]["mismatches"]
    assert run["plain"]["generated_tokens"] == run["tree"]["generated_tokens"] == 3 * 12
    # not vacuous: some step accepted a draft token besides the bonus, so fewer steps
    assert max(int(k) for k in run["tree"]["accept_hist"]) > 1, run["tree"]["accept_hist"]
    assert run["tree"]["steps"] < run["plain"]["steps"]
    assert report["config"]["drafter"]["tokenizer_check"] == "fingerprint matched"
    assert report["vllm_modules"] == [] and code == 0
