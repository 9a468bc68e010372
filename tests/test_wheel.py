"""The built wheel is what an operator installs: it must carry the presets, serve from outside
the checkout, and hold nothing of the lab (harness, demo, fixtures and their demo presets, test
helpers, references).

One module-scoped build (`pip wheel --no-deps`, compiling the C++ extension: about a minute on
the 2-core VM), listed as it is, then installed with `pip install --no-deps --target` into an
empty directory; every other check runs in a directory outside the checkout with only that
directory in front of site-packages (vLLM and torch come from the environment, as they would
beside a real install).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# What the lab keeps out of the package (benchmarks/harness/, benchmarks/demo.py,
# benchmarks/treespec_fixtures/, tests/support/): any of these paths in the wheel fails
# test_the_wheel_holds_no_lab_module.
LAB_FILES = re.compile(r"""^vllm_treespec/(
      (serving|comparison|report|demo)\.py             # the serving/benchmark harness and demo
    | fixtures/.* | ngram/fixture\.py                   # fixture models, heads and tries
    | configs/demo/.*                                  # the presets on the fixtures
    | verify/bench\.py                                 # the acceptance-rule timer
    | (.+/)?testing\.py                                # test helpers
    | (.+/)?reference\.py                              # plain references of the fast paths
    )$""", re.X)


def _source_tree(dst: Path) -> Path:
    """The checkout's files as a clean checkout has them (tracked and untracked, not ignored):
    a build from the checkout itself would pack stale modules left in its build/ directory."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    source = _source_tree(tmp_path_factory.mktemp("source"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-q", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stderr[-3000:]
    (built,) = wheels.glob("vllm_treespec-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                              "-q", "--target", str(target), str(wheel)], capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return target


def test_the_wheel_holds_no_lab_module(wheel):
    """Only the package: no harness, demo, test helper or reference module, nothing from
    benchmarks/ or tests/ (and the listing is the real one: the package's own modules are there)."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {"vllm_treespec/cli.py", "vllm_treespec/plugin.py", "vllm_treespec/verify/accept.py"} <= set(names)
    # the top-level kernels/ and configs/ ship at their package paths
    assert {"vllm_treespec/kernels/tree_attention.py", "vllm_treespec/configs/__init__.py",
            "vllm_treespec/configs/drafters/lookup-online.yaml", "vllm_treespec/configs/budgets/cpu.yaml"} <= set(names)
    assert any(re.fullmatch(r"vllm_treespec/_C\..*\.so", n) for n in names), "no compiled extension"
    lab = [n for n in names if LAB_FILES.match(n)]
    assert not lab, f"lab modules in the wheel: {lab}"
    outside = [n for n in names if not re.match(r"vllm_treespec(/|-[^/]+\.dist-info/)", n)]
    assert not outside, f"files outside the package in the wheel: {outside}"


def _outside(installed: Path, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` from a directory outside the checkout, the wheel's install first on the path
    (and no lab resolver: tests/conftest.py exports one)."""
    env = {**os.environ, "PYTHONPATH": str(installed), "TREESPEC_PATH_RESOLVER": ""}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_is_imported_not_the_checkout(installed, tmp_path):
    out = _outside(installed, tmp_path, "-c", "import vllm_treespec, vllm_treespec._C, vllm_treespec.kernels, "
                                              "vllm_treespec.configs as c; print(vllm_treespec.__file__); "
                                              "print(vllm_treespec.kernels.__file__); print(c.__file__)")
    assert out.returncode == 0, out.stderr[-2000:]
    package, kernels, configs = (Path(line) for line in out.stdout.split())
    assert package.is_relative_to(installed)
    assert kernels == installed / "vllm_treespec" / "kernels" / "__init__.py"
    assert configs == installed / "vllm_treespec" / "configs" / "__init__.py"


def test_every_shipped_preset_resolves_from_the_wheel(installed, tmp_path):
    """Production presets load or fail naming the file they need; every preset file of the
    checkout is in the wheel; the lab's demo/ presets and fixture: paths are not, and say so."""
    script = """
import json
from vllm_treespec.config import ConfigError, load_config
from vllm_treespec.presets import budget_presets, configs_dir, drafter_presets, registered_presets
out = {"dir": str(configs_dir()), "ok": [], "needs_file": [], "budgets": budget_presets(),
       "registered": registered_presets()}
for name in drafter_presets():
    try:
        load_config(name, 64)
        out["ok"].append(name)
    except ConfigError as e:
        assert "required key is missing" in str(e) and '"preset": "' + name + '"' in str(e), str(e)
        out["needs_file"].append(name)
for lab in ("demo/lookup-trie", {"drafter": {"type": "draft_model", "path": "fixture:draft-lm"}}):
    try:
        load_config(lab, 64)
        from vllm_treespec.drafters.lm.loading import resolve_model_dir
        resolve_model_dir(lab["drafter"]["path"])
    except Exception as e:
        out.setdefault("lab", []).append(str(e))
print(json.dumps(out))
"""
    out = _outside(installed, tmp_path, "-c", script)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["dir"]).is_relative_to(installed)
    shipped = ROOT / "configs"
    assert sorted(got["ok"] + got["needs_file"]) == sorted(p.stem for p in (shipped / "drafters").glob("*.yaml"))
    assert set(got["ok"]) == {"prompt-lookup", "prompt-lookup-tree", "lookup-online"} and got["registered"] == []
    demo, fixture = got["lab"]
    assert "'demo/lookup-trie' not found" in demo and "TREESPEC_PATH_RESOLVER=treespec_fixtures.resolver" in demo
    assert fixture.startswith("drafter.path: 'fixture:draft-lm': no resolver handles the prefix 'fixture:'")
    assert got["budgets"] == sorted(p.stem for p in (shipped / "budgets").glob("*.yaml"))


def test_cli_from_the_wheel_checks_a_preset(installed, tmp_path):
    out = _outside(installed, tmp_path, "-m", "vllm_treespec", "config", "check", "prompt-lookup")
    assert out.returncode == 0, out.stderr[-2000:]
    assert str(installed) in out.stdout                      # the preset file came from the wheel
    out = _outside(installed, tmp_path, "-m", "vllm_treespec", "config", "check", "lookup-trie")
    assert out.returncode == 3 and "vllm-treespec ngram build" in out.stderr


@pytest.mark.e2e
def test_wheel_serves_prompt_lookup_from_outside_the_checkout(installed, tmp_path, monkeypatch, tiny_model):
    from harness.comparison import treespec
    from harness.serving import complete, serve

    monkeypatch.chdir(tmp_path)
    with serve(tiny_model, treespec(4, "prompt-lookup").args, env={"PYTHONPATH": str(installed),
                                                                   "TREESPEC_PATH_RESOLVER": ""},
               keep_log=True) as server:
        done = complete(server.base_url, server.model, "def add(a, b):\n    return", max_tokens=8)
        log = server.log_path.read_text()
    assert done.token_ids, "no tokens served"
    assert "TreeProposer: drafter=prompt_lookup" in log
    assert f"config={installed}" in log                  # the worker read the wheel's preset
