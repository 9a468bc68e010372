"""Where a head drafter's step goes: cProfile of benchmarks/replay_tau.py's replay (4 held-out
prompts x 128 greedy tokens, one torch thread, budget 16) for one of its configs.

    .venv/bin/python benchmarks/profile_head.py jetspec-best-first
    .venv/bin/python benchmarks/profile_head.py dart-chain
"""
import cProfile, pstats, sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(1)
import replay_tau as rt
from vllm_treespec.config import from_additional_config
from vllm_treespec.drafters import make_drafter
from treespec_fixtures import build_fixture
from vllm_treespec.train.corpus import held_out_prompts
from transformers import AutoModelForCausalLM
model_dir = build_fixture("code-lm")
records = rt.reference_outputs(model_dir, held_out_prompts(16, seed=0), 128)[:4]
hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
cfg = from_additional_config({"treespec": rt.INLINE[sys.argv[1]]}, 16)
d = make_drafter(cfg.drafter, str(model_dir), cfg.tree, max_model_len=1024, max_nodes=16)
d.load(hf)
feats = rt.target_features(hf, records, d.capabilities.aux_layers)
rt.replay(d, 16, records[:1], features=feats[:1])
pr = cProfile.Profile(); pr.enable()
row = rt.replay(d, 16, records, features=feats)
pr.disable()
print(row)
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
