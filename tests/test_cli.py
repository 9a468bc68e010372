"""The vllm-treespec console script: config check / show, --version, serve's dry run
before vLLM starts (same exit codes as config check) with vLLM's own argument parser."""
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


def test_config_check(tmp_path):
    from vllm_treespec.config import CONFIGS_DIR
    from vllm_treespec.preflight import EXIT_CONFIG, EXIT_FILE

    out = run("config", "check", "prompt-lookup")
    assert out.returncode == 0 and "valid:" in out.stdout, out.stderr
    assert run("config", "check", str(CONFIGS_DIR / "drafters" / "prompt-lookup.yaml")).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter: {type: prompt_lookup, max_ngram: 0}\n")
    out = run("config", "check", str(bad))
    assert out.returncode == EXIT_CONFIG and "drafter.max_ngram" in out.stderr
    out = run("config", "check", "prompt-lookup", "--num-speculative-tokens", "0")
    assert out.returncode == 2 and "--num-speculative-tokens: 0 must be at least 1" in out.stderr
    no_weights = tmp_path / "draft"
    no_weights.mkdir()
    (no_weights / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    draft = tmp_path / "draft.yaml"
    draft.write_text(f"drafter: {{type: draft_model, path: {no_weights}}}\n")
    out = run("config", "check", str(draft))
    assert out.returncode == EXIT_FILE and "drafter.path" in out.stderr and "has no weights" in out.stderr
    out = run("config", "check")
    assert out.returncode == 2 and "give the CONFIG" in out.stderr


def test_config_check_rejects_a_missing_and_a_random_trie(tmp_path):
    """The two files an operator reported as "valid": a trie path that does not exist and 300
    random bytes."""
    from vllm_treespec.preflight import EXIT_FILE

    junk = tmp_path / "junk.trie"
    junk.write_bytes(bytes(range(256)) + bytes(44))
    for path in (tmp_path / "missing.trie", junk):
        cfg = tmp_path / "trie.yaml"
        cfg.write_text(f"preset: lookup-trie\ndrafter: {{path: {path}}}\n")
        out = run("config", "check", str(cfg))
        assert out.returncode == EXIT_FILE, out.stdout + out.stderr
        assert "drafter.path" in out.stderr and str(path) in out.stderr
        assert "vllm-treespec ngram build" in out.stderr


def test_config_show_merges_the_preset(tmp_path):
    out = run("config", "show", "demo/lookup-trie")
    assert out.returncode == 0, out.stderr
    assert "path: fixture:stdlib-3gram" in out.stdout and "type: lookup_trie" in out.stdout


def test_version_and_python_m():
    from vllm_treespec import SUPPORTED_VLLM_VERSION, __version__

    want = f"vllm-treespec {__version__} (for vLLM {SUPPORTED_VLLM_VERSION})"
    assert run("--version").stdout.strip() == want
    out = subprocess.run([sys.executable, "-m", "vllm_treespec", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == want


def _serve_cases():
    from vllm_treespec.preflight import EXIT_CONFIG, EXIT_FILE

    return [
        ('{"treespec": {"drafter": {"type": "prompt_lookup", "max_ngram": 0}}}', "drafter.max_ngram", EXIT_CONFIG),
        ('{"treespec": "missing-preset"}', "not found", EXIT_CONFIG),
        ('{"treespec": {"drafter": {"type": "prompt_lookup"}, "budget": {"max_nodes": 5}}}',
         "num_speculative_tokens=4", EXIT_CONFIG),
        ("{not json", "--additional-config must be a JSON object", EXIT_CONFIG),   # vLLM keeps the string
        ('{"treespec": {"drafter": {"type": "draft_model", "path": "/nonexistent-draft"}}}',
         "drafter.path: '/nonexistent-draft' is not a directory", EXIT_FILE),
        ('{"treespec": "lookup-trie"}', "drafter.path: required key is missing", EXIT_CONFIG),
    ]


@pytest.mark.parametrize("case", range(6))
def test_serve_rejects_bad_config_before_starting_vllm(case):
    additional, needle, code = _serve_cases()[case]
    out = run("serve", "example-org/not-downloaded", "--speculative-config", SPEC, "--additional-config", additional)
    assert out.returncode == code, out.stderr[-2000:]
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_serve_reads_flags_as_vllm_does(tmp_path):
    """vLLM's own parser: `=` forms, dotted flags and `--config FILE.yaml` reach the dry run."""
    from vllm_treespec.preflight import EXIT_CONFIG

    bad = '{"treespec": {"drafter": {"type": "prompt_lookup", "max_ngram": 0}}}'
    out = run("serve", "example-org/not-downloaded", f"--speculative-config={SPEC}", f"--additional-config={bad}")
    assert out.returncode == EXIT_CONFIG and "drafter.max_ngram" in out.stderr
    out = run("serve", "example-org/not-downloaded", "--speculative-config.model", "vllm_treespec.TreeProposer",
              "--speculative-config.num_speculative_tokens", "4", "--additional-config", bad)
    assert out.returncode == EXIT_CONFIG and "drafter.max_ngram" in out.stderr
    config = tmp_path / "serve.yaml"
    config.write_text(f"speculative-config: '{SPEC}'\nadditional-config: '{bad}'\n")
    out = run("serve", "example-org/not-downloaded", "--config", str(config))
    assert out.returncode == EXIT_CONFIG and "drafter.max_ngram" in out.stderr, out.stderr[-2000:]


def test_config_reference_in_docs_is_current():
    from vllm_treespec.config import config_reference

    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert config_reference() in doc, \
        "docs/configuration.md's reference is stale: paste `vllm-treespec config reference`"


def test_train_dart_without_data_says_what_to_run(tmp_path, capsys):
    from vllm_treespec.cli import main

    assert main(["train", "dart", "fixture:tiny", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "run `vllm-treespec train data` first" in capsys.readouterr().err


def test_the_demo_is_not_a_subcommand(capsys):
    """The demo runs from a checkout (`make demo`: benchmarks/demo.py), not from the package."""
    from vllm_treespec.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo"])
    assert exit_info.value.code == 2 and "invalid choice: 'demo'" in capsys.readouterr().err
