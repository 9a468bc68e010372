"""HeadDrafter without an engine, for every head kind (DART; JetSpec causal and bidirectional): the
rows and positions the proposer hands over become head-cache rows exactly as in training (the chain of top-1 drafts equals the argmax of the training forward
over the same prefix), across prefill chunks, accepted tree paths, recomputation after preemption
(truncate) and position gaps (restart); config errors name the key."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from vllm_treespec.config import ConfigError, parse_config
from vllm_treespec.drafters import DraftInputs, make_drafter
from vllm_treespec.drafters.base import TargetStates
from vllm_treespec.drafters.heads.checkpoint import save_head
from vllm_treespec.drafters.heads.dart import DartConfig, DartHead
from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, H, L, D = 41, 32, 6, 4
LAYERS = (1, 3)


KINDS = {"dart": (DartConfig, DartHead, {}),
         "jetspec": (JetSpecConfig, JetSpecHead, {}),
         "jetspec-bidirectional": (JetSpecConfig, JetSpecHead, {"within_block": "bidirectional"})}


def _make_head(kind, embed, **overrides):
    cfg_cls, head_cls, extra = KINDS[kind]
    cfg = cfg_cls(**{**dict(hidden_size=H, vocab_size=V, target_num_layers=L, feature_layers=LAYERS, depth=D,
                            num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48), **extra, **overrides})
    return head_cls(cfg, embed)


def _train_logits(head, feats, next_tokens, g):
    """[d, V] training-forward logits of prefix g (context rows 0..g, root next_tokens[g])."""
    if isinstance(head, DartHead):
        return head.forward_train(feats, next_tokens)[0, g]
    return head.forward_train(feats, next_tokens, torch.tensor([[g]]))[0, 0]


@pytest.fixture(scope="module", params=list(KINDS))
def setup(request, tmp_path_factory):
    torch.manual_seed(0)
    embed = nn.Embedding(V, H)
    head = _make_head(request.param, embed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    path = save_head(head, tmp_path_factory.mktemp("head"))
    target = SimpleNamespace(model=SimpleNamespace(embed_tokens=embed),
                             config=SimpleNamespace(vocab_size=V, hidden_size=H, num_hidden_layers=L))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (40,), generator=g)
    aux = [torch.randn(40, H, generator=g) for _ in LAYERS]      # vLLM order: ascending layer ids
    return path, target, head.eval(), tokens, aux


def _drafter(path, target, builder="chain", **drafter):
    kind = json.loads((path / "config.json").read_text())["kind"]
    cfg = parse_config({"drafter": {"type": kind, "path": str(path), **drafter}, "tree": {"builder": builder}})
    d = make_drafter(cfg.drafter, None, cfg.tree, max_model_len=64, max_nodes=D)
    d.load(target)
    return d


def _step(drafter, tokens, aux, positions, num_tokens):
    """One step whose committed rows sit at `positions` (flat rows = positions here)."""
    buf = tokens[None].numpy().astype(np.int32)
    pos = np.asarray(positions, dtype=np.int64)
    step_aux = [a for a in aux]                                  # flat rows = positions
    inputs = DraftInputs(req_ids=["r"], token_ids=buf, rows=np.array([0]), num_tokens=np.array([num_tokens]),
                         budgets=np.array([D]), target=TargetStates(None, step_aux, [pos], [pos]))
    return drafter.propose(inputs).trees[0]


def _expected(head, tokens, aux, upto):
    """argmax per depth of the training forward for the prefix of positions 0..upto."""
    feats = torch.cat([aux[0], aux[1]], -1)[None, :upto + 1]
    with torch.no_grad():
        logits = _train_logits(head, feats, tokens[None, 1:upto + 2], upto)
    return logits.argmax(-1).tolist()


def test_committed_rows_become_training_prefixes(setup):
    path, target, head, tokens, aux = setup
    d = _drafter(path, target)
    assert d.capabilities.aux_layers == (2, 4)                   # vLLM ids: layer i's output = id i+1
    tree = _step(d, tokens, aux, range(0, 7), 8)                 # prefill chunk 0..6, root = token 7
    assert tree.tokens[0] == tokens[7] and tree.draft_token_ids() == _expected(head, tokens, aux, 6)
    tree = _step(d, tokens, aux, range(7, 10), 11)               # root + 2 accepted nodes
    assert tree.draft_token_ids() == _expected(head, tokens, aux, 9)
    tree = _step(d, tokens, aux, range(4, 12), 13)               # recomputed after preemption
    assert tree.draft_token_ids() == _expected(head, tokens, aux, 11) and d.restarts == 0
    tree = _step(d, tokens, aux, range(20, 22), 23)              # a gap: restart from position 20
    assert d.restarts == 1 and d.base_pos["r"] == 20
    d.on_requests_finished(["r"])
    assert d.counters()["cached_requests"] == 0


def test_unsorted_feature_layers_are_concatenated_in_config_order(setup, tmp_path):
    path, target, head, tokens, aux = setup
    swapped = type(head)(type(head.config)(**{**head.config.__dict__, "feature_layers": (3, 1)}),
                         target.model.embed_tokens)
    swapped.load_state_dict(head.state_dict())
    p = save_head(swapped, tmp_path / "swapped")
    d = _drafter(p, target)
    assert d.capabilities.aux_layers == (2, 4)
    tree = _step(d, tokens, aux, range(0, 7), 8)
    feats = torch.cat([aux[1], aux[0]], -1)[None, :7]           # layer 3 first, as configured
    with torch.no_grad():
        want = _train_logits(swapped, feats, tokens[None, 1:8], 6).argmax(-1).tolist()
    assert tree.draft_token_ids() == want


def test_dtype_runs_the_head_in_that_dtype(setup):
    """drafter.dtype bfloat16: weights, embedding and cache in bfloat16 (the target's embedding
    itself stays float32), log-probs in float32, close to the float32 head's; auto = the target's."""
    path, target, head, tokens, aux = setup
    auto, bf16 = _drafter(path, target), _drafter(path, target, dtype="bfloat16")
    assert {p.dtype for p in auto.head.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.head.parameters()} == {torch.bfloat16}
    assert target.model.embed_tokens.weight.dtype == torch.float32
    trees = [_step(d, tokens, aux, range(0, 9), 10) for d in (auto, bf16)]
    cache = bf16.caches["r"]
    assert (cache.k[0] if isinstance(cache.k, list) else cache.k).dtype == torch.bfloat16
    with torch.inference_mode():
        lp32, lp16 = auto.head.draft([auto.caches["r"]]), bf16.head.draft([cache])
    assert lp16.dtype == torch.float32
    assert (lp16.exp() - lp32.exp()).abs().max() < 0.05       # bfloat16 rounding, not a different head
    assert trees[1].num_draft == trees[0].num_draft == D
    with pytest.raises(ConfigError, match="drafter.dtype"):
        parse_config({"drafter": {"type": head.config.kind, "path": str(path), "dtype": "int8"}})


def test_head_config_errors(setup):
    path = setup[0]
    kind = json.loads((path / "config.json").read_text())["kind"]
    with pytest.raises(ConfigError, match="tree.scorer: dart .* set drafter.ngram"):
        parse_config({"drafter": {"type": kind, "path": str(path)},
                      "tree": {"builder": "beam", "scorer": "dart"}})
    with pytest.raises(ConfigError, match="drafter.topk"):
        parse_config({"drafter": {"type": kind, "path": str(path), "topk": 0}})
    from vllm_treespec.drafters.heads.checkpoint import HeadCheckpointError

    cfg = parse_config({"drafter": {"type": kind, "path": "/nonexistent"}})
    with pytest.raises(HeadCheckpointError, match="drafter.path: .* is not a directory"):
        make_drafter(cfg.drafter, None, cfg.tree)
    other = "jetspec" if kind == "dart" else "dart"
    cfg = parse_config({"drafter": {"type": other, "path": str(path)}})
    with pytest.raises(HeadCheckpointError, match=f"drafter.path: .* is a {kind} head; set drafter.type: {kind}"):
        make_drafter(cfg.drafter, None, cfg.tree)


def test_replay_hands_over_rows_like_the_engine(setup):
    """benchmarks/replay_tau.py feeds a head drafter contiguous committed rows (no restarts)."""
    from benchmark_modules import load_benchmark

    path, target, head, tokens, aux = setup
    replay_tau = load_benchmark("replay_tau")
    d = _drafter(path, target)
    records = [{"prompt_ids": tokens[:10].tolist(), "output_ids": tokens[10:30].tolist()}]
    row = replay_tau.replay(d, D, records, max_len=64, features=[[a[:30] for a in aux]])
    assert row["drafted_steps"] > 0 and row["tau"] >= 1.0 and d.restarts == 0


def test_caches_stay_under_the_memory_bound(setup):
    """Past drafter.memory_mb the least recently drafted request's cache goes (it restarts at its
    next rows); a bound one request at max_model_len cannot fit fails at load, naming the key."""
    import dataclasses

    path, target, head, tokens, aux = setup
    d = _drafter(path, target)
    per_row = d.head.cache_bytes_per_row()
    d.cfg = dataclasses.replace(d.cfg, memory_mb=per_row * 12 / 2**20)     # room for 12 rows
    buf = np.stack([tokens.numpy()] * 2).astype(np.int32)

    def step(reqs, positions):
        pos = np.asarray(positions, dtype=np.int64)
        n = len(reqs)
        inputs = DraftInputs(req_ids=list(reqs), token_ids=buf, rows=np.arange(n),
                             num_tokens=np.array([pos[-1] + 2] * n), budgets=np.array([D] * n),
                             target=TargetStates(None, list(aux), [pos] * n, [pos] * n))
        return d.propose(inputs).trees

    step(["a"], range(0, 8))
    step(["b"], range(0, 8))                     # 16 rows > 12: "a" (least recent) is evicted
    assert d.counters()["evictions"] == 1 and list(d.caches) == ["b"]
    step(["a", "b"], range(8, 10))               # both drafting: "a" restarts, nothing evictable
    assert set(d.caches) == {"a", "b"} and d.base_pos["a"] == 8
    assert d._cache_bytes() == per_row * 12                # a: 2 rows, b: 10 rows

    kind = json.loads((path / "config.json").read_text())["kind"]
    cfg = parse_config({"drafter": {"type": kind, "path": str(path), "memory_mb": 1}})
    big = make_drafter(cfg.drafter, None, cfg.tree, max_model_len=2**20 // per_row + 1, max_nodes=D)
    with pytest.raises(ConfigError, match="drafter.memory_mb: one request at max_model_len"):
        big.load(target)


def test_step_tree_overrides_draft_the_overridden_section(setup):
    """A budget.table rule's tree keys (DraftInputs.tree_overrides) give the trees of a drafter
    configured with them."""
    path, target, _, tokens, aux = setup
    kind = json.loads((path / "config.json").read_text())["kind"]

    def tree_of(tree: dict, overrides: dict):
        cfg = parse_config({"drafter": {"type": kind, "path": str(path)}, "tree": tree})
        d = make_drafter(cfg.drafter, None, cfg.tree, max_model_len=64, max_nodes=D)
        d.load(target)
        pos = np.arange(0, 7)
        inputs = DraftInputs(req_ids=["r"], token_ids=tokens[None].numpy().astype(np.int32), rows=np.array([0]),
                             num_tokens=np.array([8]), budgets=np.array([D]),
                             target=TargetStates(None, list(aux), [pos], [pos]), tree_overrides=overrides)
        return d.propose(inputs).trees[0]

    got = tree_of({"builder": "best_first"}, {"max_depth": 1})
    want = tree_of({"builder": "best_first", "max_depth": 1}, {})
    plain = tree_of({"builder": "best_first"}, {})
    assert got.tokens.tolist() == want.tokens.tolist() and got.parents.tolist() == want.parents.tolist()
    assert int(got.depth.max()) == 1 < int(plain.depth.max())
