"""MambaDraftLM (drafters/lm/mamba.py): every log-prob it returns equals a fresh full forward of
the Hugging Face model over (committed context + tree path), for Mamba and Mamba-2, through
catch-ups of random sizes, recomputes, evictions and batched tree extension."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_treespec.drafters.lm.base import DraftModelError
from vllm_treespec.drafters.lm.mamba import MambaDraftLM

VOCAB = 61
TOL = 1e-4


def _tiny_model(kind: str):
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(1234)
    if kind == "mamba2":
        cfg = Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8, head_dim=8,
                           num_heads=8, expand=2, n_groups=2, chunk_size=16, tie_word_embeddings=True,
                           architectures=["Mamba2ForCausalLM"])
        model = Mamba2ForCausalLM(cfg)
    else:
        cfg = MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                          architectures=["MambaForCausalLM"])
        model = MambaForCausalLM(cfg)
    with torch.no_grad():  # move every parameter off its structured init (A_log, D, dt bias, norms)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=["mamba2", "mamba"])
def model(request, one_torch_thread):
    return _tiny_model(request.param)


def _runtime(model, max_requests=4, max_tree_nodes=16) -> MambaDraftLM:
    # small chunks so that short test prompts already cross prefill- and SSD-chunk boundaries
    return MambaDraftLM(model, max_requests=max_requests, max_tree_nodes=max_tree_nodes,
                        prefill_chunk=16, ssd_chunk=8)


@torch.no_grad()
def _fresh(model, seq) -> torch.Tensor:
    ids = torch.tensor([list(seq)], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0, -1].float().log_softmax(-1)


def _assert_close(got: torch.Tensor, model, seq) -> None:
    err = (got - _fresh(model, seq)).abs().max().item()
    assert err < TOL, f"max |log-prob error| {err:.2e} for a context of {len(seq)} tokens"


def test_catch_up_matches_fresh_forward(model) -> None:
    rt = _runtime(model)
    rng = np.random.default_rng(0)
    ids = ["a", "b", "c"]
    assert rt.admit(ids).all()
    ctxs = [rng.integers(0, VOCAB, n) for n in (50, 1, 7)]     # 50: several prefill chunks
    for step in range(8):
        out = rt.start_step(ids, ctxs)
        assert out.shape == (3, VOCAB) and out.dtype == torch.float32
        for i, ctx in enumerate(ctxs):
            _assert_close(out[i], model, ctx)
            assert rt.cached_tokens(ids[i]) == ctx.size
        # grow by accepted amounts: often 1-5 tokens, sometimes none, sometimes a long burst
        grow = [int(rng.choice([0, 1, 2, 3, 5, 20])) for _ in ids]
        ctxs = [np.concatenate([c, rng.integers(0, VOCAB, g)]) for c, g in zip(ctxs, grow)]


def test_unchanged_context_needs_no_forward(model, monkeypatch) -> None:
    rt = _runtime(model)
    ctx = np.arange(12) % VOCAB
    rt.admit(["r"])
    first = rt.start_step(["r"], [ctx])

    def boom(*args, **kwargs):
        raise AssertionError("forward ran for an unchanged context")

    monkeypatch.setattr(rt, "_forward", boom)
    again = rt.start_step(["r"], [ctx.copy()])
    assert torch.equal(first, again)


def test_diverging_context_is_recomputed(model) -> None:
    rt = _runtime(model)
    rng = np.random.default_rng(1)
    ctx = rng.integers(0, VOCAB, 30)
    rt.admit(["r", "s"])
    rt.start_step(["r", "s"], [ctx, ctx[:5]])
    changed = ctx.copy()
    changed[17] = (changed[17] + 1) % VOCAB                     # differs inside the consumed tokens
    shorter = ctx[:20]                                           # a prefix: recurrent states cannot rewind
    for r_ctx, s_ctx in [(np.concatenate([changed, [3, 4]]), ctx[:9]), (shorter, ctx[:2]), (ctx, ctx[:9])]:
        out = rt.start_step(["r", "s"], [r_ctx, s_ctx])
        _assert_close(out[0], model, r_ctx)
        _assert_close(out[1], model, s_ctx)
        assert rt.cached_tokens("r") == r_ctx.size and rt.cached_tokens("s") == s_ctx.size


def _random_tree_step(rt: MambaDraftLM, model, ctxs, rng, depths=4):
    """Extend a random tree per request, one call per depth, checking every node; returns each
    request's nodes as (parent, token, path)."""
    n_req = len(ctxs)
    trees = [[(-1, int(c[-1]), [])] for c in ctxs]          # node 0 = root (empty path beyond the context)
    frontier = [[0] for _ in range(n_req)]
    for _ in range(depths):
        req_index, parent, tokens = [], [], []
        for r in range(n_req):
            pending = 0
            for node in frontier[r]:
                fan = min(int(rng.integers(0 if node else 1, 3)), rt.max_tree_nodes - len(trees[r]) - pending)
                pending += fan
                for tok in rng.choice(VOCAB, size=fan, replace=False):
                    req_index.append(r), parent.append(node), tokens.append(int(tok))
        if not req_index:
            break
        # shuffle: node ids follow call order per request, whatever the interleaving of requests
        perm = rng.permutation(len(req_index))
        req_index, parent, tokens = (np.array(v)[perm] for v in (req_index, parent, tokens))
        out = rt.extend(req_index, parent, tokens)
        assert out.shape == (len(req_index), VOCAB)
        frontier = [[] for _ in range(n_req)]
        for j, (r, p, t) in enumerate(zip(req_index, parent, tokens)):
            path = trees[r][p][2] + [int(t)]
            trees[r].append((int(p), int(t), path))
            frontier[r].append(len(trees[r]) - 1)
            _assert_close(out[j], model, np.concatenate([ctxs[r], np.array(path, np.int64)]))
    return trees


def test_extend_random_trees_match_fresh_forward(model) -> None:
    rt = _runtime(model, max_requests=3, max_tree_nodes=16)
    rng = np.random.default_rng(2)
    ids = ["x", "y", "z"]
    ctxs = [rng.integers(0, VOCAB, n) for n in (20, 3, 9)]
    rt.admit(ids)
    for _ in range(3):
        out = rt.start_step(ids, ctxs)
        for i in range(3):
            _assert_close(out[i], model, ctxs[i])
        trees = _random_tree_step(rt, model, ctxs, rng)
        # accept a random root-to-node path plus a bonus token; drafting must not have touched
        # the committed state the next catch-up starts from
        new = []
        for ctx, tree in zip(ctxs, trees):
            path = tree[int(rng.integers(0, len(tree)))][2]
            new.append(np.concatenate([ctx, np.array(path, np.int64), rng.integers(0, VOCAB, 1)]))
        ctxs = new


def test_accepted_path_resumes_from_tree_state(model) -> None:
    """After drafting, the next catch-up starts from the accepted path's deepest tree node: one
    recurrent step per request (the bonus token), not a re-feed of the accepted tokens."""
    rt = _runtime(model, max_requests=2, max_tree_nodes=8)
    ids = ["a", "b"]
    ctxs = [np.array([3, 1, 4, 1, 5]), np.array([9, 2, 6])]
    rt.admit(ids)
    rt.start_step(ids, ctxs)
    rt.extend(np.array([0, 0, 1]), np.array([0, 0, 0]), np.array([7, 8, 7]))   # a: 1, 2; b: 1
    rt.extend(np.array([0, 1, 0]), np.array([2, 1, 1]), np.array([9, 9, 10]))  # a: 3 under 2, 4 under 1; b: 2
    # a accepts 8, 9 (nodes 2, 3) + bonus 11; b accepts 7 (node 1) then diverges from its tree: 12, 13
    new = [np.concatenate([ctxs[0], [8, 9, 11]]), np.concatenate([ctxs[1], [7, 12, 13]])]
    fed = []
    inner = rt._forward

    def spy(tokens, lens, conv, ssm):
        fed.extend([tokens.shape[1]] * tokens.shape[0] if lens is None else lens.tolist())
        return inner(tokens, lens, conv, ssm)

    rt._forward = spy
    out = rt.start_step(ids, new)
    assert sorted(fed) == [1, 2]      # tokens fed per request; a: bonus only; b: 12, 13 after node 1
    for i in range(2):
        _assert_close(out[i], model, new[i])
        assert rt.cached_tokens(ids[i]) == new[i].size


def test_extend_validates_nodes(model) -> None:
    rt = _runtime(model, max_requests=2, max_tree_nodes=4)
    rt.admit(["a", "b"])
    rt.start_step(["a", "b"], [np.array([1, 2, 3]), np.array([4])])
    assert rt.extend(np.array([], np.int64), np.array([], np.int64), np.array([], np.int64)).shape == (0, VOCAB)
    with pytest.raises(ValueError, match="parent"):
        rt.extend(np.array([0]), np.array([1]), np.array([5]))          # node 1 does not exist yet
    rt.extend(np.array([0, 1, 0]), np.array([0, 0, 0]), np.array([5, 6, 7]))  # a: nodes 1, 2; b: node 1
    with pytest.raises(ValueError, match="parent"):
        rt.extend(np.array([1]), np.array([2]), np.array([5]))          # b has no node 2
    with pytest.raises(ValueError, match="max_tree_nodes"):
        rt.extend(np.array([0, 0]), np.array([1, 2]), np.array([8, 9]))  # a would need nodes 3 and 4
    with pytest.raises(ValueError, match="out of range"):
        rt.extend(np.array([2]), np.array([0]), np.array([5]))
    with pytest.raises(ValueError, match="vocabulary"):
        rt.extend(np.array([0]), np.array([0]), np.array([VOCAB]))


def test_admit_evicts_least_recently_used_outside_the_call(model) -> None:
    rt = _runtime(model, max_requests=2)
    ctx = {"a": np.array([1, 2, 3]), "b": np.array([4, 5]), "c": np.array([6, 7, 8, 9])}
    assert rt.admit(["a", "b"]).tolist() == [True, True]
    rt.start_step(["a", "b"], [ctx["a"], ctx["b"]])
    assert rt.admit(["b"]).tolist() == [True]                     # b is now the most recently used
    assert rt.admit(["c"]).tolist() == [True]                     # evicts a, not b
    assert rt.cached_tokens("a") == 0 and rt.cached_tokens("b") == 2 and rt.cached_tokens("c") == 0
    # all slots held by requests of this call: a gets none
    assert rt.admit(["a", "b", "c"]).tolist() == [False, True, True]
    out = rt.start_step(["b", "c"], [ctx["b"], ctx["c"]])
    _assert_close(out[0], model, ctx["b"])
    _assert_close(out[1], model, ctx["c"])
    with pytest.raises(ValueError, match="no cache slot"):
        rt.start_step(["a"], [ctx["a"]])
    # a comes back (evicting b, the least recently used) and is recomputed from scratch
    assert rt.admit(["a"]).tolist() == [True]
    assert rt.cached_tokens("b") == 0
    _assert_close(rt.start_step(["a"], [ctx["a"]])[0], model, ctx["a"])


def test_admit_more_requests_than_slots(model) -> None:
    rt = _runtime(model, max_requests=3)
    ok = rt.admit([f"r{i}" for i in range(5)])
    assert ok.dtype == bool and ok.tolist() == [True, True, True, False, False]
    assert rt.cached_tokens("r3") == 0


def test_release_frees_slots(model) -> None:
    rt = _runtime(model, max_requests=1)
    rt.admit(["a"])
    rt.start_step(["a"], [np.array([1, 2, 3])])
    assert rt.admit(["b"]).tolist() == [True]       # a is not in the call: evicted
    rt.release(["b", "never-seen"])
    assert rt.cached_tokens("b") == 0
    assert rt.admit(["c"]).tolist() == [True]
    ctx = np.array([5, 6, 7, 8])
    rt.start_step(["c"], [ctx])
    rt.extend(np.array([0]), np.array([0]), np.array([3]))
    rt.release(["c"])
    with pytest.raises(ValueError, match="lost its cache slot"):
        rt.extend(np.array([0]), np.array([1]), np.array([3]))
    rt.admit(["c"])                                 # same id again: fresh state, nothing stale
    assert rt.cached_tokens("c") == 0
    _assert_close(rt.start_step(["c"], [ctx])[0], model, ctx)


@pytest.mark.parametrize("kind", ["mamba2", "mamba"])
def test_load_ignores_init_only_residual_rescale(kind: str, tmp_path: Path, one_torch_thread) -> None:
    """transformers applies rescale_prenorm_residual to loaded weights too; load() must serve the
    checkpoint's weights regardless."""
    model = _tiny_model(kind)
    model.config.rescale_prenorm_residual = True
    model.save_pretrained(str(tmp_path))
    rt = MambaDraftLM.load(tmp_path, max_requests=1, max_tree_nodes=2)
    rt.admit(["a"])
    _assert_close(rt.start_step(["a"], [np.array([4, 5, 6, 7])])[0], model, [4, 5, 6, 7])


def test_load_and_config_errors(model, tmp_path: Path) -> None:
    arch = model.config.architectures[0]
    model.save_pretrained(str(tmp_path / "m"))
    rt = MambaDraftLM.load(tmp_path / "m", max_requests=2, max_tree_nodes=8)
    assert rt.architecture == arch and rt.vocab_size == VOCAB and rt.max_tree_nodes == 8
    rt.admit(["a"])
    _assert_close(rt.start_step(["a"], [np.array([1, 2, 3])])[0], model, [1, 2, 3])

    with pytest.raises(DraftModelError, match="config.json"):
        MambaDraftLM.load(tmp_path / "missing", max_requests=1, max_tree_nodes=1)
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    with pytest.raises(DraftModelError, match="Qwen3ForCausalLM"):
        MambaDraftLM.load(tmp_path / "qwen", max_requests=1, max_tree_nodes=1)
    with pytest.raises(DraftModelError, match="not Linear"):
        MambaDraftLM(torch.nn.Linear(2, 2), max_requests=1, max_tree_nodes=1)
    with pytest.raises(DraftModelError, match="max_tree_nodes"):
        MambaDraftLM(model, max_requests=1, max_tree_nodes=0)
    with pytest.raises(DraftModelError, match="max_requests"):
        MambaDraftLM(model, max_requests=0, max_tree_nodes=4)
    with pytest.raises(DraftModelError, match="max_state_bytes"):
        MambaDraftLM(model, max_requests=64, max_tree_nodes=64, max_state_bytes=1 << 20)


# ---------------------------------------------------------------------------- the trained fixture


def test_mamba_fixture_recipe_matches_the_code_lm_fixtures() -> None:
    from treespec_fixtures import FIXTURES
    from treespec_fixtures.cache import recipe_key
    from treespec_fixtures.code_lm import DRAFT_LM_RECIPE
    from treespec_fixtures.mamba_lm import MAMBA_DRAFT_LM_RECIPE, MAMBA_SHAPE, hf_config

    assert FIXTURES["mamba-draft-lm"][0] is MAMBA_DRAFT_LM_RECIPE
    assert recipe_key(MAMBA_DRAFT_LM_RECIPE) != recipe_key(DRAFT_LM_RECIPE)
    for key in ("tokenizer", "eval"):          # same tokenizer artifact, same held-out windows
        assert MAMBA_DRAFT_LM_RECIPE[key] == DRAFT_LM_RECIPE[key]
    assert MAMBA_DRAFT_LM_RECIPE["train"]["data_seed"] == DRAFT_LM_RECIPE["train"]["data_seed"]
    assert MAMBA_DRAFT_LM_RECIPE["shape"]["vocab_size"] == DRAFT_LM_RECIPE["shape"]["vocab_size"]
    cfg = hf_config(MAMBA_SHAPE, eos_token_id=0, init_std=0.02)   # a valid Mamba2Config
    assert cfg.num_heads * cfg.head_dim == cfg.expand * cfg.hidden_size


@pytest.mark.slow
def test_mamba_fixture_beats_unigram_and_matches_runtime(one_torch_thread) -> None:
    from transformers import Mamba2ForCausalLM

    from treespec_fixtures import build_fixture
    from treespec_fixtures.code_lm import EVAL, TOKENIZER_FILES, load_tokens, tokenizer_dir
    from treespec_fixtures.mamba_lm import unigram_perplexity
    from treespec_fixtures.train_lm import eval_windows, perplexity

    d = build_fixture("mamba-draft-lm")
    meta = json.loads((d / "fixture.json").read_text())
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Mamba2ForCausalLM"] and (d / "model.safetensors").exists()
    for name in TOKENIZER_FILES:
        assert (d / name).read_bytes() == (tokenizer_dir() / name).read_bytes()
    windows = eval_windows(load_tokens("held"), EVAL["windows"], EVAL["seq_len"])
    unigram = unigram_perplexity(load_tokens("train"), windows, cfg["vocab_size"])
    ppl = meta["heldout_perplexity"]
    assert math.isfinite(ppl) and 1.0 < ppl < unigram
    # plain from_pretrained (as any HF user loads it) reproduces the recorded perplexity: the saved
    # config has no load-time side effects on the weights
    assert cfg.get("rescale_prenorm_residual") is False
    model = Mamba2ForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    assert perplexity(model, windows, threads=1) == pytest.approx(ppl, rel=1e-3)
    # and the runtime serves them: catch-up plus one tree level equal fresh forwards
    rt = MambaDraftLM.load(d, max_requests=2, max_tree_nodes=8)
    ctx = windows[0, :300].numpy()
    rt.admit(["p"])
    out = rt.start_step(["p"], [ctx])
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ctx)[None], use_cache=False).logits[0, -1].log_softmax(-1)
    assert (out[0] - ref).abs().max().item() < TOL
    top = out[0].topk(2).indices.numpy()
    ext = rt.extend(np.array([0, 0]), np.array([0, 0]), top)
    for j, t in enumerate(top):
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(np.append(ctx, t))[None],
                        use_cache=False).logits[0, -1].log_softmax(-1)
        assert (ext[j] - ref).abs().max().item() < TOL
