"""Draft language model runtimes for the draft-model drafter (see base.py for the interface)."""
from vllm_treespec.drafters.lm.base import DraftLM, DraftModelError

__all__ = ["DraftLM", "DraftModelError"]
