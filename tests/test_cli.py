"""The vllm-treespec console script: fixtures, config check, serve's early config validation."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXE = shutil.which("vllm-treespec") or str(Path(sys.executable).with_name("vllm-treespec"))
SPEC = json.dumps({"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": 4})


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_fixtures_prints_directory_last(tiny_model):
    out = run("fixtures", "tiny")
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert Path(last) == tiny_model and (Path(last) / "config.json").exists()


def test_config_check(tmp_path):
    assert run("config", "check", "configs/drafters/prompt-lookup.yaml").returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter: {type: prompt_lookup, max_ngram: 0}\n")
    out = run("config", "check", str(bad))
    assert out.returncode == 1 and "drafter.max_ngram" in out.stderr
    out = run("config", "check", "configs/drafters/prompt-lookup.yaml", "--num-speculative-tokens", "0")
    assert out.returncode == 0  # no max_nodes set: nothing to exceed
    no_weights = tmp_path / "draft"
    no_weights.mkdir()
    (no_weights / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    draft = tmp_path / "draft.yaml"
    draft.write_text(f"drafter: {{type: draft_model, path: {no_weights}}}\n")
    out = run("config", "check", str(draft))
    assert out.returncode == 1 and "drafter.path" in out.stderr and "has no weights" in out.stderr


@pytest.mark.parametrize("additional, needle", [
    ('{"treespec": {"drafter": {"type": "prompt_lookup", "max_ngram": 0}}}', "drafter.max_ngram"),
    ('{"treespec": "missing-preset"}', "not found"),
    ('{"treespec": {"drafter": {"type": "prompt_lookup"}, "budget": {"max_nodes": 5}}}', "num_speculative_tokens=4"),
    ("{not json", "--additional-config: not valid JSON"),
    ('{"treespec": {"drafter": {"type": "draft_model", "path": "/nonexistent-draft"}}}',
     "drafter.path: '/nonexistent-draft' is not a directory"),
])
def test_serve_rejects_bad_config_before_starting_vllm(additional, needle):
    out = run("serve", "/nonexistent-model", "--speculative-config", SPEC, "--additional-config", additional)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_config_reference_in_readme_is_current():
    from vllm_treespec.config import config_reference

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert config_reference() in readme, "README's configuration reference is stale: paste `vllm-treespec config reference`"


def test_train_dart_without_data_says_what_to_run(tmp_path, capsys):
    from vllm_treespec.cli import main

    assert main(["train", "dart", "fixture:tiny", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "run `vllm-treespec train data` first" in capsys.readouterr().err
