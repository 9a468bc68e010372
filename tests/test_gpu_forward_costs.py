"""benchmarks/gpu_forward_costs.py (CPU --tiny smoke: every measurement present and positive; the
graph-capturable head cores equal the heads' own `draft`) and benchmarks/project_gpu_speedup.py
(the projection formula on a hand-computed case). No GPU, no vLLM."""
from __future__ import annotations

import json

import pytest
import torch
from benchmark_modules import load_benchmark

gfc = load_benchmark("gpu_forward_costs")
pgs = load_benchmark("project_gpu_speedup")


def _positive(x) -> bool:
    return isinstance(x, float) and x > 0


def test_tiny_cpu_run_records_every_measurement(tmp_path):
    assert gfc.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batches", "1", "2",
                     "--rows", "1", "4", "16", "--chain-ks", "4", "8"]) == 0
    r = json.loads((tmp_path / "gpu_forward_costs.json").read_text())
    assert r["errors"] == [] and r["vllm_imported"] is False
    assert r["method"]["attention"] and r["method"]["attention_tries"][r["method"]["attention"]] == "ok"
    target = r["target"]["results"]
    assert [(x["batch"], x["rows"]) for x in target] == [(b, n) for b in (1, 2) for n in (1, 4, 16)]
    assert all(_positive(x["graph_ms"]) and _positive(x["eager_ms"]) for x in target)
    assert set(r["heads"]) == {"dart", "jetspec", "diffusion"}
    assert r["heads"]["diffusion"]["config"]["within_block"] == "bidirectional"
    for entry in r["heads"].values():
        assert [x["batch"] for x in entry["results"]] == [1, 2]
        assert all(_positive(x["step_eager_ms"]) and _positive(x["core_graph_ms"]) for x in entry["results"])
    for x in r["draft_lm"]["results"]:
        assert _positive(x["forward_graph_ms"]) and _positive(x["forward_eager_ms"])
        assert set(x["chain_graph_ms"]) == {"4", "8"} and all(map(_positive, x["chain_graph_ms"].values()))


def test_budget_guard_records_skips(tmp_path):
    assert gfc.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batches", "1", "--rows", "1",
                     "--chain-ks", "4", "--budget-s", "0"]) == 0
    r = json.loads((tmp_path / "gpu_forward_costs.json").read_text())
    assert r["errors"] and all("budget" in e for e in r["errors"])
    assert "graph_ms" not in r["target"]["results"][0]


def test_attention_matches_reference():
    op, tries = gfc.pick_attention(torch.device("cpu"), torch.float32, 8, 2, 16)
    assert tries[op.kind] == "ok"
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    for kind in ("sdpa_packed_gqa_mask", "sdpa_bool_mask_gqa"):
        for n in (1, 5):
            got = gfc.AttentionOp(kind)(q[:, :, :n], k, v)
            torch.testing.assert_close(got, gfc._reference_attention(q[:, :, :n], k, v), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["dart", "jetspec", "diffusion"])
def test_head_core_equals_head_draft(kind):
    """The graph-timed core does the drafter's arithmetic: same top-k as head.draft on the same
    cache (prefix rows from `extend`, then the committed rows)."""
    torch.manual_seed(0)
    cfg = gfc.Settings(device=torch.device("cpu"), dtype=torch.float32, tiny=True, context=20, batches=(2,),
                       rows=(1,), chain_ks=(4,), commit_rows=3, reps=1, eager_reps=1, budget=gfc.Budget(60))
    config = gfc.head_configs(gfc.TINY_TARGET)[kind]
    head = gfc.build_head(kind, config, torch.randn(config.vocab_size, config.hidden_size) * 0.02,
                          cfg.device, cfg.dtype)
    b, prefix = 2, cfg.context - cfg.commit_rows
    core = gfc.dart_core(head, cfg, b) if kind == "dart" else gfc.jetspec_core(head, kind, cfg, b)
    caches = []
    for i in range(b):
        c = head.extend(head.new_cache(), torch.randn(prefix, core.feats.shape[-1]),
                        torch.randint(0, config.vocab_size, (prefix,)))
        ks, vs = (c.k, c.v) if isinstance(c.k, list) else ([c.k], [c.v])
        for (pk, pv), k, v in zip(core.past, ks, vs):
            pk[i, :, :prefix], pv[i, :, :prefix] = k, v
        caches.append(head.extend(c, core.feats[i], core.nxt[i]))
    with torch.inference_mode():
        ref = torch.topk(head.draft(caches), gfc.HEAD_TOPK[kind], dim=-1)
        got = core.fn()
    assert torch.equal(ref.indices, got.indices)
    torch.testing.assert_close(got.values, ref.values, atol=1e-4, rtol=1e-4)


# -- projection ------------------------------------------------------------------------------

def _costs() -> dict:
    curve = {1: 10.0, 2: 10.5, 4: 11.0, 8: 12.0, 16: 14.0}
    return {"device_name": "synthetic", "context": 1024, "method": {"attention": "x"},
            "target": {"results": [{"batch": 1, "rows": n, "graph_ms": ms} for n, ms in curve.items()]},
            "heads": {"dart": {"results": [{"batch": 1, "step_eager_ms": 3.0, "core_graph_ms": 1.0}]}},
            "draft_lm": {"results": [{"batch": 1, "forward_graph_ms": 0.5, "forward_eager_ms": 2.0,
                                      "chain_graph_ms": {"3": 1.8}}]}}


def _record(tmp_path: Path) -> Path:
    rows = [  # every step drafts: tokens_per_step = tau
        {"config": "dart-chain", "budget": 16, "tau": 3.0, "tokens_per_step": 3.0, "steps": 100,
         "drafted_steps": 100, "mean_nodes": 5.0, "draft_ms_per_step": 11.0,
         "treespec": {"drafter": {"type": "dart", "path": "fixture:dart-head"}, "tree": {"builder": "chain"}}},
        # half the steps draft; a chain of 3 nodes = 3 draft-LM calls (measured as one chain graph)
        {"config": "lm", "budget": 8, "tau": 3.0, "tokens_per_step": 2.0, "steps": 10, "drafted_steps": 5,
         "mean_nodes": 3.0, "draft_ms_per_step": 4.0,
         "treespec": {"drafter": {"type": "draft_model", "path": "fixture:draft-lm"},
                      "tree": {"builder": "chain", "max_depth": 4}}},
        {"config": "mamba", "budget": 8, "tau": 2.0, "tokens_per_step": 2.0, "steps": 1, "drafted_steps": 1,
         "mean_nodes": 3.0, "draft_ms_per_step": 4.0,
         "treespec": {"drafter": {"type": "draft_model", "path": "fixture:mamba-draft-lm"}}},
        {"config": "prompt-lookup", "budget": 8, "tau": 4.0, "tokens_per_step": 4.0, "steps": 1,
         "drafted_steps": 1, "mean_nodes": 7.0, "draft_ms_per_step": 0.5},
    ]
    path = tmp_path / "replay_tau_synthetic.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_projection_hand_computed(tmp_path):
    result = pgs.project(_costs(), [_record(tmp_path)])
    got = {(r["config"], r["draft_variant"]): r for r in result["rows"]}
    # dart, graph core: rows 6 -> T = 11 + (12 - 11) * 2 / 4 = 11.5; (11.5 + 1) / 3 per token vs 10
    dart = got[("dart-chain", "graph")]
    assert dart["target_rows_ms"] == pytest.approx(11.5)
    assert dart["spec_ms_per_token"] == pytest.approx(12.5 / 3)
    assert dart["speedup"] == pytest.approx(10 * 3 / 12.5)
    assert got[("dart-chain", "eager")]["speedup"] == pytest.approx(10 * 3 / 14.5)
    # draft LM: rows 4 (T 11) on half the steps, T(1) = 10 on the rest, chain graph of 3 = 1.8 ms
    lm = got[("lm", "graph")]
    assert lm["draft_cost_from"] == "draft_lm chain_graph_ms[3]"
    assert lm["step_ms"] == pytest.approx(0.5 * 11 + 0.5 * 10 + 1.8)
    assert lm["speedup"] == pytest.approx(10 * 2 / 12.3)
    assert got[("lm", "eager")]["draft_ms"] == pytest.approx(3 * 2.0)
    # CPU drafter: the record's own ms; preset resolved from configs/
    pl = got[("prompt-lookup", "cpu")]
    assert pl["drafter"] == "prompt_lookup" and pl["draft_ms"] == pytest.approx(0.5)
    assert pl["speedup"] == pytest.approx(10 * 4 / (12.0 + 0.5))
    assert [s["drafter"] for s in result["skipped"]] == ["mamba"]
    assert pgs.interpolate({1: 1.0, 4: 4.0}, 5.0) is None


def test_projection_cli_writes_json_and_markdown(tmp_path):
    (tmp_path / "gpu_forward_costs.json").write_text(json.dumps(_costs()))
    assert pgs.main(["--costs", str(tmp_path), "--records", str(_record(tmp_path)), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "project_gpu_speedup.md").read_text()
    assert "Projection, not a measurement" in md and "dart-chain @ 16" in md
    assert json.loads((tmp_path / "project_gpu_speedup.json").read_text())["rows"]
