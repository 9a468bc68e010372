"""The `vllm-treespec` console script (also `python -m vllm_treespec`).

  vllm-treespec serve MODEL [any `vllm serve` flags]   vLLM's OpenAI server, after the dry run below
  vllm-treespec config check CONFIG [--model DIR] [--num-speculative-tokens N]
                                                       dry run: everything that can fail before the
                                                       first request (vllm_treespec/preflight.py)
  vllm-treespec config show CONFIG                     the config with its presets merged in (YAML)
  vllm-treespec config reference                       the config reference table
  vllm-treespec ngram ... / train ...                  trie files and draft-head training
  vllm-treespec --version

`serve` and `config check` exit with the same code for the same failure (preflight.EXIT_*):
0 ok, 2 bad command line, 3 bad config, 4 a file the config names is missing or corrupt, 5 a file
made for another model, 6 vLLM missing or not the supported version.

The demo and the fixtures are not subcommands: they run from a source checkout (`make demo`,
benchmarks/demo.py; `python -m treespec_fixtures NAME`).
"""
from __future__ import annotations

import argparse
import sys


def cmd_config(ns: argparse.Namespace) -> int:
    from vllm_treespec.config import config_reference, load_config
    from vllm_treespec.preflight import EXIT_USAGE, check_deployment, report_failure

    if ns.action == "reference":
        print(config_reference())
        return 0
    if not ns.path:
        print(f"vllm-treespec config {ns.action}: give the CONFIG (a preset name or a YAML path)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(ns.path, ns.num_speculative_tokens)
        if ns.action == "show":
            import yaml

            print(f"# {cfg.source}")
            print(yaml.safe_dump({k: v for k, v in cfg.as_dict().items() if k != "source"},
                                 sort_keys=False), end="")
            return 0
        checked = check_deployment(cfg, ns.model, num_speculative_tokens=ns.num_speculative_tokens)
    except Exception as e:                                  # noqa: BLE001 - mapped to an exit code
        return report_failure(e, "invalid")
    for line in checked:
        print(f"checked {line}")
    print(f"valid: {cfg.source}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from vllm_treespec import SUPPORTED_VLLM_VERSION, __version__

    p = argparse.ArgumentParser(prog="vllm-treespec", description="Tree speculative decoding for vLLM")
    p.add_argument("--version", action="version",
                   version=f"vllm-treespec {__version__} (for vLLM {SUPPORTED_VLLM_VERSION})")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="vLLM's OpenAI server: vllm-treespec serve MODEL [vllm serve flags]",
                   add_help=False)
    cfg = sub.add_parser("config", help="dry-run a deployment config, show it merged, or print the reference")
    cfg.add_argument("action", choices=["check", "show", "reference"])
    cfg.add_argument("path", nargs="?", metavar="CONFIG", help="a preset name or a YAML path")
    cfg.add_argument("--model", default=None, metavar="DIR",
                     help="the served model's directory: check tokenizers and heads against it")
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
        from vllm_treespec.launch import cmd_serve

        return cmd_serve(argv[1:])
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
