"""DraftModelDrafter without an engine: its lockstep trees equal the synchronous builders over
fresh HF forwards, the bandit learns per request, and bad model directories fail with errors
naming the key and the fix."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vllm_treespec.config import parse_config
from vllm_treespec.drafters import DraftInputs, make_drafter
from vllm_treespec.drafters.lm import DraftModelError
from vllm_treespec.tree import Expander, build_tree

VOCAB = 61


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from treespec_fixtures.qwen3 import Qwen3Shape, new_model

    shape = Qwen3Shape(vocab_size=VOCAB, hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=12, intermediate_size=64, max_position_embeddings=256)
    d = tmp_path_factory.mktemp("draft")
    new_model(shape, eos_token_id=0, seed=5, init_std=0.3).save_pretrained(str(d), safe_serialization=True)
    return d


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory):
    from treespec_fixtures.mamba_lm import Mamba2Shape, new_model

    shape = Mamba2Shape(vocab_size=VOCAB, hidden_size=32, num_layers=2, state_size=8, head_dim=16)
    d = tmp_path_factory.mktemp("mamba")
    model = new_model(shape, eos_token_id=0, seed=6, init_std=0.3, scaled_residual_init=True)
    model.save_pretrained(str(d), safe_serialization=True)
    return d


def _drafter(model_dir, tree: dict, max_nodes: int = 12, **drafter):
    cfg = parse_config({"drafter": {"type": "draft_model", "path": str(model_dir), **drafter}, "tree": tree})
    return make_drafter(cfg.drafter, None, cfg.tree, max_model_len=128, max_nodes=max_nodes)


def _inputs(contexts, budgets, req_ids=None):
    width = max(len(c) for c in contexts) + 4
    buf = np.zeros((len(contexts), width), dtype=np.int32)
    for i, c in enumerate(contexts):
        buf[i, :len(c)] = c
    return DraftInputs(req_ids=req_ids or [f"r{i}" for i in range(len(contexts))], token_ids=buf,
                       rows=np.arange(len(contexts)), num_tokens=np.array([len(c) for c in contexts]),
                       budgets=np.asarray(budgets, dtype=np.int64))


def _reference_tree(model, context, builder, budget, params):
    """The synchronous builder over an Expander that runs a fresh HF forward per path."""
    def fn(paths, k):
        toks, lps = [], []
        for p in paths:
            ids = torch.as_tensor(list(context) + list(p))[None]
            with torch.inference_mode():
                lp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)
            top = torch.topk(lp, k)
            toks.append(top.indices.numpy()), lps.append(top.values.double().numpy())
        return np.stack(toks), np.stack(lps)
    return build_tree(builder, Expander(fn, root=int(context[-1]), context=context), budget, **params)


@pytest.mark.parametrize("builder,tree,params", [
    ("threshold", {"branch": 3, "max_depth": 4, "tau": 0.02}, {"branch": 3, "max_depth": 4, "tau": 0.02}),
    ("static", {"template": [3, 2, 1]}, {"template": (3, 2, 1)}),
    ("chain", {"max_depth": 5}, {"max_depth": 5}),
    ("best_first", {"max_depth": 4}, {"max_depth": 4, "topk": 8}),          # prefetch 4 (default)
    ("best_first", {"max_depth": 4, "prefetch": 1}, {"max_depth": 4, "topk": 8}),
    ("best_first", {"max_depth": 5, "topk": 3, "prefetch": 9}, {"max_depth": 5, "topk": 3}),
])
@pytest.mark.parametrize("kind", ["transformer", "mamba"])
def test_lockstep_trees_equal_synchronous_builders(model_dir, mamba_dir, kind, builder, tree, params):
    from transformers import AutoModelForCausalLM

    d = model_dir if kind == "transformer" else mamba_dir
    extra = {"rescale_prenorm_residual": False} if kind == "mamba" else {}   # see MambaDraftLM.load
    model = AutoModelForCausalLM.from_pretrained(str(d), **extra).eval()
    drafter = _drafter(d, {"builder": builder, **tree})
    rng = np.random.default_rng(3)
    contexts = [rng.integers(1, VOCAB, size=n) for n in (6, 13, 2)]
    budgets = [10, 0, 7]
    for step in range(3):
        trees = drafter.propose(_inputs(contexts, budgets)).trees
        for i, ctx in enumerate(contexts):
            if budgets[i] == 0:
                assert trees[i].num_draft == 0
                continue
            ref = _reference_tree(model, ctx, builder, budgets[i], params)
            assert trees[i].tokens.tolist() == ref.tokens.tolist(), (step, i)
            assert trees[i].parents.tolist() == ref.parents.tolist(), (step, i)
            np.testing.assert_allclose(trees[i].score, ref.score, atol=1e-4)
        # commit a random accepted prefix of each tree's first chain plus a bonus token
        contexts = [np.concatenate([c, rng.integers(1, VOCAB, size=int(rng.integers(1, 4)))]) for c in contexts]


def test_best_first_prefetch_sizes_the_drafter_for_twice_the_nodes(model_dir):
    """Prefetched expansions can double a request's drafted nodes (tree/builders/best_first.py)."""
    assert _drafter(model_dir, {"builder": "best_first"}, max_nodes=12).lm.max_tree_nodes == 25
    assert _drafter(model_dir, {"builder": "best_first", "prefetch": 1}, max_nodes=12).lm.max_tree_nodes == 13
    assert _drafter(model_dir, {"builder": "chain"}, max_nodes=12).lm.max_tree_nodes == 13


@pytest.mark.parametrize("tree, overrides", [
    ({"builder": "best_first", "max_depth": 6}, {"max_depth": 2, "topk": 2}),
    ({"builder": "threshold", "branch": 3, "max_depth": 4, "tau": 0.02}, {"branch": 1, "tau": 0.1}),
    ({"builder": "static", "template": [3, 2, 1]}, {"template": (1, 1, 1, 1)}),
])
def test_step_tree_overrides_draft_the_overridden_section(model_dir, tree, overrides):
    """A budget.table rule's tree keys (DraftInputs.tree_overrides) give the trees of a drafter
    configured with them."""
    rng = np.random.default_rng(5)
    contexts = [rng.integers(1, VOCAB, size=n) for n in (6, 13)]
    inputs = _inputs(contexts, [10, 7])
    inputs.tree_overrides = overrides
    got = _drafter(model_dir, tree).propose(inputs).trees
    want = _drafter(model_dir, {**tree, **overrides}).propose(_inputs(contexts, [10, 7])).trees
    plain = _drafter(model_dir, tree).propose(_inputs(contexts, [10, 7])).trees
    for g, w in zip(got, want):
        assert g.tokens.tolist() == w.tokens.tolist() and g.parents.tolist() == w.parents.tolist()
    assert any(g.parents.tolist() != p.parents.tolist() for g, p in zip(got, plain))


def test_bandit_learns_per_request_and_forgets_finished(model_dir):
    drafter = _drafter(model_dir, {"builder": "static"}, templates=[[2, 1], [1, 1, 1, 1]])
    ctx = np.arange(1, 9)
    for step in range(6):
        drafter.propose(_inputs([ctx], [8], ["a"]))
        ctx = np.concatenate([ctx, [3, 4]])                  # two tokens committed per step
    bandit = drafter.bandits["a"]
    assert sum(bandit.counts) == 5 and min(bandit.counts) >= 1
    drafter.on_requests_finished(["a"])
    assert "a" not in drafter.bandits and drafter.lm.cached_tokens("a") == 0


def _sp(temperature, seed=None, top_p=1.0):
    from types import SimpleNamespace

    return SimpleNamespace(temperature=temperature, top_k=0, top_p=top_p, min_p=0.0, seed=seed)


@pytest.mark.parametrize("builder,shape", [("static", {"template": [3, 2, 1]}),
                                          ("threshold", {"branch": 2, "max_depth": 4, "tau": 0.01}),
                                          ("chain", {"max_depth": 4})])
def test_sampled_drafts_are_draws_from_the_processed_q(model_dir, builder, shape):
    """draft_sampling: sample: a sampling request's children are distinct draws, in draw order,
    from q = its processed fresh-forward distribution, whose rows reach the engine for exactly the
    expanded nodes; a greedy request in the same batch keeps its top-k tree."""
    from transformers import AutoModelForCausalLM

    from vllm_treespec.verify import SamplingParamsBatch
    from vllm_treespec.verify.sampling_params import target_probs

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    sampled = _drafter(model_dir, {"builder": builder, **shape}, draft_sampling="sample")
    topk = _drafter(model_dir, {"builder": builder, **shape})
    rng = np.random.default_rng(4)
    contexts = [rng.integers(1, VOCAB, size=n) for n in (7, 11)]
    params = [_sp(0.0), _sp(0.8, seed=3, top_p=0.95)]
    inputs = _inputs(contexts, [10, 10])
    inputs.sampling = params
    proposal = sampled.propose(inputs)
    trees = proposal.trees
    assert trees[0].tokens.tolist() == topk.propose(_inputs(contexts, [10, 10])).trees[0].tokens.tolist()
    assert set(proposal.draft_probs) == {1}
    assert topk.propose(_inputs(contexts, [10, 10])).draft_probs == {}    # top-k trees carry no q
    tree, dp = trees[1], proposal.draft_probs[1]
    assert tree.num_draft > 1
    expanded = set(tree.parents[1:].tolist())
    assert {v for v in range(tree.num_nodes) if dp.node_rows[v] >= 0} >= expanded
    sp = SamplingParamsBatch.from_params([params[1]])
    for v in range(tree.num_nodes):
        if dp.node_rows[v] < 0:
            continue
        path, u = [], v
        while u > 0:
            path.append(int(tree.tokens[u]))
            u = int(tree.parents[u])
        ids = torch.as_tensor(list(contexts[1]) + path[::-1])[None]
        with torch.inference_mode():
            lp = torch.log_softmax(model(input_ids=ids).logits[0, -1:].float(), -1)
        want = target_probs(lp, sp.rows(torch.zeros(1, dtype=torch.int64)))[0]
        q = dp.probs[dp.node_rows[v]]
        torch.testing.assert_close(q, want, atol=1e-5, rtol=1e-4)
        kids = tree.tokens[tree.parents == v]
        assert len(set(kids.tolist())) == len(kids) and bool((q[torch.as_tensor(kids)] > 0).all())
    again = _drafter(model_dir, {"builder": builder, **shape}, draft_sampling="sample")
    inputs2 = _inputs(contexts, [10, 10])
    inputs2.sampling = params
    assert again.propose(inputs2).trees[1].tokens.tolist() == tree.tokens.tolist()   # seeded: reproducible


def test_sample_mode_needs_a_draw_order_builder(model_dir):
    from vllm_treespec.config import ConfigError

    with pytest.raises(ConfigError, match="drafter.draft_sampling: sample needs .* 'best_first' ranks"):
        _drafter(model_dir, {"builder": "best_first"}, draft_sampling="sample")
    # auto (the default) samples wherever the builder keeps draw order, top_k elsewhere
    assert not _drafter(model_dir, {"builder": "best_first"}).capabilities.samples_drafts
    assert _drafter(model_dir, {"builder": "threshold"}).capabilities.samples_drafts
    assert not _drafter(model_dir, {"builder": "threshold"}, draft_sampling="top_k").capabilities.samples_drafts


def _copy(model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    return d


def test_bad_model_directories_name_the_key_and_fix(model_dir, tmp_path):
    with pytest.raises(DraftModelError, match="drafter.path: .* is not a directory"):
        _drafter(tmp_path / "missing", {"builder": "chain"})
    d = _copy(model_dir, tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(DraftModelError, match="no config.json"):
        _drafter(d, {"builder": "chain"})
    shutil.rmtree(d)
    d = _copy(model_dir, tmp_path)
    for f in d.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(DraftModelError, match="has no weights"):
        _drafter(d, {"builder": "chain"})
    shutil.rmtree(d)
    d = _copy(model_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    with pytest.raises(DraftModelError, match="'BertForMaskedLM'.*supported: LlamaForCausalLM"):
        _drafter(d, {"builder": "chain"})
    from vllm_treespec.drafters.lm.loading import DraftModelSpec, load_draft_lm

    with pytest.raises(DraftModelError, match="drafter.memory_mb: 1 MB cannot hold .* one request's cache"):
        load_draft_lm(DraftModelSpec(str(model_dir), memory_mb=1), served_tokenizer=None,
                      max_len=100_000, max_tree_nodes=16)
    lm = load_draft_lm(DraftModelSpec(str(model_dir), memory_mb=2), served_tokenizer=None,
                       max_len=1000, max_tree_nodes=16)
    assert 1 <= lm.slots.num_slots < 64                            # the bound caps the slots


def test_tokenizer_mismatch_is_a_startup_error(tmp_path):
    from vllm_treespec.drafters.lm.loading import DraftModelSpec, check_draft_model
    from treespec_fixtures import build_fixture

    tiny = build_fixture("tiny")              # its own BPE tokenizer, unlike the draft fixtures
    draft = _copy(tiny, tmp_path)
    check_draft_model(DraftModelSpec(str(draft)), str(tiny))      # same tokenizer: fine
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[5:7]
    vocab[a], vocab[b] = vocab[b], vocab[a]                        # two ids swapped
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(DraftModelError, match="tokenizer .* differs from the served model's"):
        check_draft_model(DraftModelSpec(str(draft)), str(tiny))
