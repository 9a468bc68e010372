"""Load-dependent budgets (vllm_treespec.budget): tables, the auto policy and their config."""
from __future__ import annotations

import pytest

from vllm_treespec.budget import (AutoBudget, BudgetChoice, CostModel, FixedBudget, TableBudget,
                                  TableRule, default_candidates, make_budget_policy)
from vllm_treespec.config import CONFIGS_DIR, ConfigError, config_reference, load_config

OK = {"type": "prompt_lookup"}
TRIE = {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}


def table(*rules: tuple) -> list[TableRule]:
    """rules as (batch, nodes) or (batch, context, nodes)."""
    out = []
    for r in rules:
        if len(r) == 2:
            out.append(TableRule(batch=r[0], nodes=r[1]))
        else:
            out.append(TableRule(batch=r[0], context=r[1], nodes=r[2]))
    return out


# -- table ---------------------------------------------------------------------------------
def test_table_lookup_by_batch_boundaries():
    t = TableBudget(table(((1, 1), 16), ((2, 4), 8), ((5, 16), 4), ((17, None), 0)))
    got = {b: t.choose(b).nodes for b in (0, 1, 2, 4, 5, 16, 17, 10_000)}
    assert got == {0: 16, 1: 16, 2: 8, 4: 8, 5: 4, 16: 4, 17: 0, 10_000: 0}
    assert t.max_nodes == 16 and t.mode == "table"
    assert t.lookup(17).plain and not t.lookup(16).plain


def test_table_lookup_by_context_boundaries():
    t = TableBudget(table(((1, 4), (0, 2047), 32), ((1, 4), (2048, None), 8), ((5, None), 0)))
    assert t.choose(1, 0).nodes == 32
    assert t.choose(4, 2047).nodes == 32
    assert t.choose(4, 2048).nodes == 8
    assert t.choose(2, 100_000).nodes == 8
    assert t.choose(5, 10).nodes == 0 and t.choose(5, 10).plain


def test_table_as_vllm_schedule():
    t = TableBudget(table(((1, 4), (0, 1023), 32), ((1, 4), (1024, None), 8), ((5, 16), 4),
                          ((17, None), 0)))
    assert t.vllm_schedule(64) == [(1, 4, 32), (5, 16, 4), (17, 64, 0)]
    assert t.vllm_schedule(8, context_len=4096) == [(1, 4, 8), (5, 8, 4)]


def test_table_cap_and_overrides():
    t = TableBudget([TableRule((1, 2), 64, max_depth=8, builder_params={"topk": 4}),
                     TableRule((3, None), 16)], cap=32)
    c = t.choose(1)
    assert c == BudgetChoice(32, 8, {"topk": 4}) and t.max_nodes == 32
    assert c.tree_params({"topk": 8, "max_depth": 16, "scorer": "acc_logp"}) == {
        "topk": 4, "max_depth": 8, "scorer": "acc_logp"}
    assert t.choose(3).tree_params({"max_depth": 16}) == {"max_depth": 16}


@pytest.mark.parametrize("rules, needles", [
    ([((1, 4), 8), ((3, None), 0)], ["budget.table[1].batch", "[3, null] overlaps budget.table[0]",
                                     "disjoint"]),
    ([((1, None), 8), ((1, None), 0)], ["budget.table[1].batch", "overlaps budget.table[0]"]),
    ([((1, 4), (0, 100), 8), ((1, 4), (50, None), 4), ((5, None), 0)],
     ["budget.table[1].context", "[50, null] overlaps budget.table[0]", "context [0, 100]"]),
    ([((1, 2), 8), ((5, None), 0)], ["budget.table[0].batch", "ends at 2", "batch sizes 3..4",
                                     "add a rule from 3"]),
    ([((2, None), 8)], ["budget.table[0].batch", "starts at 2", "batch sizes 1", "start it at 1"]),
    ([((1, 4), 8), ((5, 16), 4)], ["budget.table[1].batch", "ends at 16", "batch sizes 17 and up",
                                   "null = no upper limit"]),
    ([((1, 4), (0, 1023), 8), ((5, None), 0)],
     ["budget.table[0].context", "ends at 1023", "batch sizes 1..4 at context lengths 1024 and up"]),
    ([((1, 4), (100, None), 8), ((5, None), 0)],
     ["budget.table", "batch sizes 1..4 at context lengths 0..99"]),
    ([((0, 4), 8)], ["budget.table[0].batch", "[0, 4]", "1 <= first <= last"]),
    ([((5, 2), 8)], ["budget.table[0].batch", "[5, 2]"]),
    ([], ["budget.table", "empty"]),
])
def test_table_errors_name_the_key(rules, needles):
    with pytest.raises(ConfigError) as e:
        TableBudget(table(*rules))
    for needle in needles:
        assert needle in str(e.value), f"{needle!r} missing from: {e.value}"


def test_plain_budget_and_fixed():
    assert BudgetChoice(0).plain and not BudgetChoice(1).plain
    f = FixedBudget(8)
    assert f.choose(1).nodes == f.choose(1000, 10**6).nodes == 8 and f.max_nodes == 8
    f.observe(query_tokens=9, step_seconds=0.01, budgets=[8], accepted=[3])   # no-op
    assert AutoBudget([0]).choose(3).plain


# -- cost model ----------------------------------------------------------------------------
def test_cost_model_interpolates_and_extrapolates():
    m = CostModel([(1, 0.010), (64, 0.012), (256, 0.020)])
    assert m(1) == pytest.approx(0.010)
    assert m(0.5) == pytest.approx(0.010)                  # flat below the first point
    assert m(160) == pytest.approx(0.016)                  # between 64 and 256
    assert m(512) == pytest.approx(0.020 + 256 * 0.008 / 192)   # last segment's slope goes on
    assert CostModel([(4, 0.01)])(4) is None and not CostModel().ready


def test_cost_model_refines_online_per_bucket():
    m = CostModel([(1, 0.010), (64, 0.012), (256, 0.020)], ema=0.5)
    for _ in range(20):
        m.observe(70, 0.016)                               # the profile was optimistic here
    assert m.points()[0] == [1.0, 70.0, 256.0]             # the bucket's centroid replaced (64, .012)
    assert m(70) == pytest.approx(0.016) and m(1) == pytest.approx(0.010)
    for _ in range(20):
        m.observe(70, 0.030)                               # slower than the profile's 256 tokens
    assert m(70) == pytest.approx(m(256)) and m(70) > 0.029   # non-decreasing; live data weighs more
    assert m(512) > m(256)                                 # the pooled flat tail is not extrapolated
    qs, ss = m.points()
    assert ss == sorted(ss)


def test_cost_model_seed_replaces_profile_points_but_not_observed_buckets():
    m = CostModel(ema=0.5)
    for _ in range(5):
        m.observe(70, 0.016)
    assert not m.ready                                     # one known query count
    m.seed([(1, 0.010), (64, 0.012), (256, 0.020)])        # e.g. the engine's startup profile
    assert m.points()[0] == [1.0, 70.0, 256.0]             # the served bucket still wins over 64
    assert m(1) == pytest.approx(0.010)
    with pytest.raises(ValueError, match="query_tokens >= 1"):
        m.seed([(0, 0.01)])


def test_startup_profile_sizes_reach_the_largest_verify_step():
    from vllm_treespec.engine.verify_profile import profile_sizes

    assert profile_sizes(56) == [1, 2, 4, 8, 16, 32, 56]
    assert profile_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert profile_sizes(1) == [1]
    with pytest.raises(ValueError):
        profile_sizes(0)


# -- auto ----------------------------------------------------------------------------------
def flat(q: float) -> float:   # memory-bound: extra query tokens nearly free
    return 0.010 + 1e-6 * q


def steep(q: float) -> float:  # compute-bound: every query token costs
    return 0.005 + 1e-3 * q


def profile(cost, qs=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)):
    return [(q, cost(q)) for q in qs]


def test_auto_cheap_verify_picks_large_budget_at_batch_1():
    p = AutoBudget([0, 4, 16, 64], profile=profile(flat))
    assert p.choose(1).nodes == 64


def test_auto_steep_cost_picks_plain_decoding_at_large_batch():
    p = AutoBudget([0, 4, 16, 64], profile=profile(steep))
    assert p.choose(64).plain
    assert p.choose(1).nodes > 0      # one request still gains from drafting
    rates = p.predicted_rates(64)
    assert rates[0] == pytest.approx(64 / steep(64))


def test_auto_learns_acceptance_and_drafter_time():
    p = AutoBudget([0, 4, 64], profile=profile(flat), prior_weight=0)
    assert p.choose(1).nodes == 64
    for _ in range(200):   # budget 64 accepts no more than 4 does, and drafting 64 is slow
        p.observe(query_tokens=65, step_seconds=flat(65), budgets=[64], accepted=[1],
                  drafter_seconds=0.05)
        p.observe(query_tokens=5, step_seconds=flat(5), budgets=[4], accepted=[1],
                  drafter_seconds=0.001)
    est = p.estimates()
    assert est[64]["accepted"] == pytest.approx(1.0, abs=0.01)
    assert est[64]["draft_seconds"] == pytest.approx(0.05, rel=0.01)
    assert p.predicted_rates(1)[4] > p.predicted_rates(1)[64]
    assert p.choose(2).nodes == 4                          # a fresh bucket takes the best directly


def test_auto_estimates_are_monotone_and_bounded():
    p = AutoBudget([0, 2, 8, 16], prior_weight=0, accept_ema=0.5)
    p.observe(query_tokens=9, step_seconds=0.01, budgets=[8, 8], accepted=[6, 8])
    p.observe(query_tokens=17, step_seconds=0.01, budgets=[16], accepted=[3])
    p.observe(query_tokens=3, step_seconds=0.01, budgets=[2], accepted=[2])
    est = p.estimates()
    acc = [est[b]["accepted"] for b in (0, 2, 8, 16)]
    assert acc == sorted(acc) and acc[0] == 0 and acc[1] <= 2
    assert est[8]["accepted"] == est[16]["accepted"]      # pooled: 16 may not look worse than 8


def test_auto_maps_observed_budgets_to_nearest_candidate_and_fill():
    p = AutoBudget([0, 8, 16], prior_weight=0, accept_ema=1.0, ema=1.0)
    p.observe(query_tokens=12, step_seconds=0.01, budgets=[7, 15, 0], accepted=[2, 5, 0],
              drafted=[3, 5, 0])
    est = p.estimates()
    assert est[8]["accepted"] == 2.0 and est[16]["accepted"] == 5.0
    assert est[16]["fill"] == pytest.approx(8 / 22)        # the step's budget was 15 -> 16
    with pytest.raises(ValueError, match="one entry per request"):
        p.observe(query_tokens=1, step_seconds=0.01, budgets=[1, 2], accepted=[1])


def test_auto_without_cost_points_uses_smallest_drafting_budget():
    p = AutoBudget([0, 4, 16])
    assert p.choose(1).nodes == 4 and p.choose(100).nodes == 4
    p.observe(query_tokens=5, step_seconds=flat(5), budgets=[4], accepted=[2])
    p.observe(query_tokens=50, step_seconds=flat(50), budgets=[4] * 10, accepted=[2] * 10)
    assert p.cost.ready and p.choose(1).nodes == 16


class Scripted(AutoBudget):
    """Predicted rates come from a script: isolates hysteresis and exploration."""

    def __init__(self, script, **kw):
        super().__init__([0, 4, 8, 16], **kw)
        self.script = iter(script)

    def predicted_rates(self, batch_size):
        return next(self.script)


def r(best: int, lead: float = 0.2) -> dict[int, float]:
    rates = {0: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
    rates[best] = 1.0 + lead
    return rates


def test_hysteresis_no_flip_flop_on_alternating_noise():
    p = Scripted([r(4), *[r(16) if i % 2 else r(4) for i in range(20)]], patience=3)
    assert {p.choose(1).nodes for _ in range(21)} == {4}
    p = Scripted([r(4), *[r(16) if i % 3 else r(4) for i in range(20)]], patience=3)
    assert {p.choose(1).nodes for _ in range(21)} == {4}   # 2 wins in a row, then the current again


def test_hysteresis_counts_any_challenger():
    """The current budget losing to one candidate or another, decision after decision, is not
    noise: after `patience` such decisions the policy moves to the best of the last one."""
    p = Scripted([r(4), r(16), r(8), r(16), r(16)], patience=3)
    assert [p.choose(1).nodes for _ in range(5)] == [4, 4, 4, 16, 16]


def test_hysteresis_switches_after_patience_consecutive_wins():
    p = Scripted([r(4), r(16), r(16), r(4), r(16), r(16), r(16), r(16)], patience=3)
    assert [p.choose(1).nodes for _ in range(8)] == [4, 4, 4, 4, 4, 4, 16, 16]
    assert p.buckets[1].switches == 1


def test_hysteresis_margin_and_buckets():
    small = {0: 1.0, 4: 1.0, 8: 1.04, 16: 1.0}            # 8 leads by 4% < 5% margin
    p = Scripted([r(4), *[small] * 10, r(16)], patience=3, margin=0.05)
    assert [p.choose(1).nodes for _ in range(11)] == [4] * 11
    assert p.choose(64).nodes == 16                        # another bucket: its own first choice
    assert p.buckets[1].current == 4 and p.buckets[7].current == 16


def test_exploration_is_deterministic():
    def run():
        p = Scripted([r(4)] * 12, explore_every=4)
        return [(c.nodes, c.explored) for c in (p.choose(3) for _ in range(12))]
    got = run()
    assert got == run()
    assert [n for n, e in got if e] == [8, 0, 8]            # up, down, up from the current 4
    assert [i + 1 for i, (_, e) in enumerate(got) if e] == [4, 8, 12]
    assert all(n == 4 for n, e in got if not e)
    p = Scripted([r(16)] * 8, explore_every=4)             # at the top: only the smaller neighbour
    assert {c.nodes for c in (p.choose(1) for _ in range(8)) if c.explored} == {8}
    p = Scripted([r(4)] * 8, explore_every=0)
    assert not any(p.choose(1).explored for _ in range(8))


def test_auto_end_to_end_noisy_acceptance_does_not_flip_flop():
    """Real observations: budget 16's measured acceptance alternates high/low every step, so the
    best budget alternates between 16 and 4; patience (not the margin, 0 here) keeps the choice."""
    def run(patience: int) -> list[int]:
        p = AutoBudget([0, 4, 16], profile=profile(flat), prior_weight=0, accept_ema=0.9,
                       margin=0.0, patience=patience)
        p.observe(query_tokens=5, step_seconds=flat(5), budgets=[4], accepted=[2])
        choices = []
        for i in range(30):
            choices.append(p.choose(1).nodes)
            p.observe(query_tokens=17, step_seconds=flat(17), budgets=[16],
                      accepted=[12 if i % 2 else 0])
        return choices
    assert set(run(3)) == {16}
    assert set(run(1)[1:]) == {4, 16}                      # without hysteresis it flip-flops


# -- config ----------------------------------------------------------------------------------
PRESETS = sorted(p.stem for p in (CONFIGS_DIR / "budgets").glob("*.yaml"))


def test_presets_exist():
    assert {"cpu", "h100", "h200"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_budget_preset_loads_and_validates(preset):
    cfg = load_config({"drafter": OK, "budget": {"mode": "table", "preset": preset}}, 1024)
    policy = make_budget_policy(cfg.budget, 1024)
    assert isinstance(policy, TableBudget)
    assert policy.choose(1).nodes == cfg.node_budget(1024) == policy.max_nodes
    sizes = [1, 2, 4, 8, 16, 64, 256, 4096]
    nodes = [policy.choose(b).nodes for b in sizes]
    assert nodes == sorted(nodes, reverse=True)            # more load, never a larger budget
    assert load_config({"drafter": OK, "budget": {"mode": "table", "preset": str(
        CONFIGS_DIR / "budgets" / f"{preset}.yaml")}}, 1024).budget.rules() == cfg.budget.rules()


def test_fixed_mode_is_todays_behaviour():
    cfg = load_config({"drafter": OK}, 8)
    assert cfg.budget.mode == "fixed" and cfg.node_budget(8) == 8
    assert make_budget_policy(cfg.budget, 8).choose(100).nodes == 8
    cfg = load_config({"drafter": OK, "budget": {"max_nodes": 3}}, 8)
    assert make_budget_policy(cfg.budget, 8).choose(1).nodes == cfg.node_budget(8) == 3


def test_inline_table_and_cap():
    budget = {"mode": "table", "max_nodes": 16,
              "table": [{"batch": [1, 2], "nodes": 32},
                        {"batch": [3, 8], "context": [0, 1023], "nodes": 8},
                        {"batch": [3, 8], "context": [1024, None], "nodes": 4},
                        {"batch": [9, None], "nodes": 0}]}
    cfg = load_config({"drafter": TRIE, "tree": {"builder": "best_first"}, "budget": budget}, 16)
    assert cfg.node_budget(16) == 16
    p = make_budget_policy(cfg.budget, 16)
    assert p.choose(1) == BudgetChoice(16)
    assert [p.choose(4, c).nodes for c in (0, 1023, 1024)] == [8, 8, 4]
    assert p.choose(9).plain
    # per-rule tree overrides reach the step's choice (DraftInputs.tree_overrides in the engine)
    rules = [{**budget["table"][0], "max_depth": 3, "tree": {"topk": 2}}, *budget["table"][1:]]
    cfg = load_config({"drafter": TRIE, "tree": {"builder": "best_first"}, "budget": {**budget, "table": rules}}, 16)
    choice = make_budget_policy(cfg.budget, 16).choose(1)
    assert choice.tree_params(cfg.tree.builder_params()) == {**cfg.tree.builder_params(), "max_depth": 3, "topk": 2}
    assert make_budget_policy(cfg.budget, 16).choose(4).tree_params({}) == {}


def test_auto_config_makes_auto_policy():
    cfg = load_config({"drafter": OK, "budget": {"mode": "auto", "auto": {
        "candidates": [0, 4, 8, 32], "patience": 2, "explore_every": 0,
        "profile": [[1, 0.01], [64, 0.02]]}}}, 32)
    p = make_budget_policy(cfg.budget, 32)
    assert isinstance(p, AutoBudget) and p.candidates == [0, 4, 8, 32] and p.patience == 2
    assert p.cost.ready and cfg.node_budget(32) == 32
    p2 = make_budget_policy(cfg.budget, 32, profile=[(1, 0.01), (2, 0.02), (3, 0.03)])
    assert p2.cost.points()[0] == [1.0, 2.0, 3.0]           # the engine's startup profile wins
    default = make_budget_policy(load_config({"drafter": OK, "budget": {"mode": "auto"}}, 12).budget, 12)
    assert default.candidates == default_candidates(12) == [0, 1, 2, 4, 8, 12]
    capped = load_config({"drafter": OK, "budget": {"mode": "auto", "max_nodes": 8,
                                                    "auto": {"candidates": [0, 16, 64]}}}, 64)
    assert make_budget_policy(capped.budget, 64).candidates == [0, 8] and capped.node_budget(64) == 8


@pytest.mark.parametrize("budget, needles, extra", [
    ({"mode": "tabel"}, ["budget.mode", "'tabel'", "'table'"], {}),
    ({"table": [{"batch": [1, None], "nodes": 4}]}, ["budget.table", "mode table", "mode: table"], {}),
    ({"preset": "cpu"}, ["budget.preset", "mode table"], {}),
    ({"auto": {"margin": 0.1}}, ["budget.auto", "mode auto"], {}),
    ({"reach_floor": 1.5}, ["budget.reach_floor", "1.5"], {}),
    ({"reach_floor": -0.1}, ["budget.reach_floor"], {}),
    ({"reach_flor": 0.1}, ["budget.reach_flor", "unknown key", "did you mean 'reach_floor'"], {}),
    ({"mode": "table"}, ["budget.table", "budget.preset", "cpu", "h100"], {}),
    ({"mode": "table", "preset": "cpu", "table": []}, ["budget.preset", "either preset or table"], {}),
    ({"mode": "table", "preset": "tpu"}, ["budget.preset", "'tpu'", "not found", "h200"], {}),
    ({"mode": "table", "table": [{"batch": [1, 4], "nodes": 4}, {"batch": [3, None], "nodes": 0}]},
     ["budget.table[1].batch", "overlaps budget.table[0]"], {}),
    ({"mode": "table", "table": [{"batch": [1, 4], "nodes": 4}]},
     ["budget.table[0].batch", "ends at 4", "5 and up"], {}),
    ({"mode": "table", "table": [{"batch": [1], "nodes": 4}]},
     ["budget.table[0].batch", "[1]", "[first, last]"], {}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": -1}]},
     ["budget.table[0].nodes", "out of range"], {}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "depth": 3}]},
     ["budget.table[0].depth", "unknown key", "max_depth"], {}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 16}]},
     ["budget.table[0].nodes", "num_speculative_tokens=8", "budget.max_nodes"], {}),
    ({"mode": "table", "preset": "h100"},
     ["h100.yaml: table[0].nodes", "raise num_speculative_tokens to 128"], {}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "tree": {"topk": 2}}]},
     ["budget.table[0].tree.topk", "only max_depth applies"], {"tree": {"builder": "best_first"}}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "tree": {"width": 2}}]},
     ["budget.table[0].tree.width", "not used by builder 'best_first'"],
     {"drafter": TRIE, "tree": {"builder": "best_first"}}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "max_depth": 3}]},
     ["budget.table[0].max_depth", "builder 'static'"],
     {"drafter": TRIE, "tree": {"builder": "static", "template": [2, 1]}}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "tree": {"template": [2, 1]}}]},
     ["budget.table[0].tree.template", "drafter.templates", "bandit"],
     {"drafter": {"type": "draft_model", "path": "fixture:draft-lm", "templates": [[2, 1], [1, 1, 1]]},
      "tree": {"builder": "static", "template": [2, 1]}}),
    ({"mode": "table", "table": [{"batch": [1, None], "nodes": 4, "tree": {"tau": 5.0}}]},
     ["budget.table[0]", "tau"], {"drafter": TRIE, "tree": {"builder": "threshold"}}),
    ({"mode": "auto", "auto": {"candidates": [0, 4, 16]}},
     ["budget.auto.candidates[2]", "num_speculative_tokens=8"], {}),
    ({"mode": "auto", "auto": {"candidates": []}}, ["budget.auto.candidates", "empty"], {}),
    ({"mode": "auto", "auto": {"candidates": [-1]}}, ["budget.auto.candidates[0]", "out of range"], {}),
    ({"mode": "auto", "auto": {"ema": 0}}, ["budget.auto.ema", "0 < ema <= 1"], {}),
    ({"mode": "auto", "auto": {"patience": 0}}, ["budget.auto.patience", "out of range"], {}),
    ({"mode": "auto", "auto": {"profile": [[0, 0.1]]}}, ["budget.auto.profile[0]", "query_tokens >= 1"], {}),
    ({"mode": "auto", "auto": {"profile": [[4]]}}, ["budget.auto.profile[0]", "[query_tokens, seconds]"], {}),
    ({"mode": "auto", "auto": {"margn": 0.1}}, ["budget.auto.margn", "unknown key", "margin"], {}),
    ({"mode": "auto", "auto": {"startup_profile": "no"}}, ["budget.auto.startup_profile", "true or false"], {}),
    ({"auto": {"startup_profile": False}}, ["budget.auto", "only with budget.mode auto"], {}),
])
def test_bad_budget_config_names_the_key(budget, needles, extra):
    raw = {"drafter": OK, **extra, "budget": budget}
    with pytest.raises(ConfigError) as e:
        load_config(raw, 8)
    for needle in needles:
        assert needle in str(e.value), f"{needle!r} missing from: {e.value}"


def test_bad_preset_file_names_file_and_key(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("table:\n  - {batch: [1, 4], nodes: 8}\n  - {batch: [6, null], nodes: 0}\n")
    with pytest.raises(ConfigError, match=r"budget.preset .*mine.yaml: table\[0\].batch: ends at 4"):
        load_config({"drafter": OK, "budget": {"mode": "table", "preset": str(f)}}, 8)
    f.write_text("rules: []\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: rules: unknown key"):
        load_config({"drafter": OK, "budget": {"mode": "table", "preset": str(f)}}, 8)


def test_reference_lists_budget_keys():
    ref = config_reference()
    for key in ["budget.mode", "budget.preset", "budget.table", "budget.table[].batch",
                "budget.table[].nodes", "budget.auto.candidates", "budget.auto.patience"]:
        assert f"`{key}`" in ref


def test_only_the_auto_policy_learns_from_steps():
    """BudgetControl tells a policy about every step only if it learns from it."""
    for mode, learns in (("fixed", False), ("table", False), ("auto", True)):
        budget = {"mode": mode} if mode != "table" else {"mode": "table", "table": [{"batch": [1, None], "nodes": 4}]}
        cfg = load_config({"drafter": OK, "budget": budget}, 8)
        assert make_budget_policy(cfg.budget, 8).learns is learns, mode
