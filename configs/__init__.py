"""Deployment configs shipped with the package, installed as `vllm_treespec.configs`: drafter
presets (drafters/NAME.yaml, by name in `preset:`) and budget tables (budgets/NAME.yaml, by name
in `budget.preset`). Data only; `vllm_treespec.presets` reads them."""
