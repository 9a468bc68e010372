"""The code-LM / draft-LM fixtures: held-out isolation, shared tokenizer, sane training metadata."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vllm_treespec.train import corpus
from treespec_fixtures.cache import recipe_key
from treespec_fixtures.code_lm import CODE_LM_RECIPE, DRAFT_LM_RECIPE, TOKENIZER_FILES


def test_held_out_files_never_in_training_list() -> None:
    train, held = corpus.split_files()
    assert held and train
    assert not set(train) & set(held)
    assert all(corpus.is_held_out(p) for p in held)
    assert not any(corpus.is_held_out(p) for p in train)
    assert len(train) + len(held) == len(corpus.stdlib_files())


def test_recipes_differ_and_share_tokenizer_settings() -> None:
    assert recipe_key(CODE_LM_RECIPE) != recipe_key(DRAFT_LM_RECIPE)
    assert CODE_LM_RECIPE["tokenizer"] == DRAFT_LM_RECIPE["tokenizer"]
    assert CODE_LM_RECIPE["eval"] == DRAFT_LM_RECIPE["eval"]
    assert CODE_LM_RECIPE["shape"]["vocab_size"] == DRAFT_LM_RECIPE["shape"]["vocab_size"]
    for recipe in (CODE_LM_RECIPE, DRAFT_LM_RECIPE):
        assert recipe["shape"]["head_dim"] in (32, 64, 128)  # vLLM CPU attention


def test_lr_schedule_warms_up_then_decays() -> None:
    from treespec_fixtures.train_lm import TrainConfig, lr_at

    cfg = TrainConfig(steps=100, batch_size=1, seq_len=8, lr=1e-3, warmup_steps=10)
    lrs = [lr_at(s, cfg) for s in range(cfg.steps)]
    assert lrs[0] < lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)


@pytest.fixture(scope="module")
def lm_dirs() -> tuple[Path, Path]:
    from treespec_fixtures import build_fixture

    return build_fixture("code-lm"), build_fixture("draft-lm")


@pytest.mark.slow
def test_models_share_identical_tokenizer_files(lm_dirs: tuple[Path, Path]) -> None:
    code, draft = lm_dirs
    assert code != draft
    for name in TOKENIZER_FILES:
        assert (code / name).read_bytes() == (draft / name).read_bytes()


@pytest.mark.slow
def test_newline_is_its_own_token(lm_dirs: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(lm_dirs[0] / "tokenizer.json"))
    text = "def f(x):\n    if x:\n        return 1\n\n    return 2\n"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    newline = tok.token_to_id("\u010a")  # byte-level alphabet's "\n"
    assert enc.ids.count(newline) == text.count("\n")


@pytest.mark.slow
def test_metadata_is_sane(lm_dirs: tuple[Path, Path]) -> None:
    import hashlib

    metas = [json.loads((d / "fixture.json").read_text()) for d in lm_dirs]
    code, draft = metas
    vocab = CODE_LM_RECIPE["shape"]["vocab_size"]
    for d, meta in zip(lm_dirs, metas):
        assert meta["kind"] == "trained"
        assert math.isfinite(meta["final_train_loss"]) and meta["final_train_loss"] < math.log(vocab)
        assert 1.0 < meta["heldout_perplexity"] < vocab / 4
        assert meta["train_tokens"] > 0 and meta["train_seconds"] > 0
        assert meta["tokenizer_sha256"] == hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest()
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == vocab
        assert (d / "model.safetensors").exists()
    assert draft["params"] < code["params"]
    assert code["heldout_eval"] == draft["heldout_eval"]
    assert code["heldout_perplexity"] < draft["heldout_perplexity"]
