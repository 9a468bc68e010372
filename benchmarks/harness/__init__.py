"""What the benchmark scripts, the demo and the tests share, kept out of the installed package.

Benchmark scripts run as ``python benchmarks/NAME.py`` (benchmarks/ is then first on sys.path)
and the tests get benchmarks/ on their path from pyproject.toml's pytest ``pythonpath``, so both
import ``harness.<module>``:

- serving, comparison, report: start and measure `vllm-treespec serve`, compare configs side
  by side, print tables and record where a result was measured;
- accept_latency: per-call latency of the acceptance rules;
- random_trees, paged_cache, triton_mode: random trees/candidates, vLLM-layout paged caches,
  whether Triton kernels can run here;
- kernel_reference, dict_trie: plain references of the kernels and of the C++ n-gram trie.

Nothing here imports vLLM at module level (the GPU check imports these without it).

Importing the harness imports the lab's fixtures (treespec_fixtures, beside it), so `fixture:NAME`
paths and `demo/NAME` presets resolve in the script and in the servers and engines it starts.
"""
import treespec_fixtures  # noqa: F401  (registers the fixture: resolver; exports it to children)
