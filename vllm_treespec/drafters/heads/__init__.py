"""Learned parallel draft heads (issue 8): small modules that read the target's hidden states and
predict several future positions in one forward pass.

- ``dart``: DART (paper 000), one decoder layer over [features, shifted embedding] + d-1 mask
  rows, shifted logits (heads/dart.py);
- ``jetspec``: JetSpec (paper 001), a few decoder layers with the projected features injected as
  context K/V, a block of root + d mask rows, unshifted logits; ``within_block: bidirectional``
  is the DFlash-style diffusion head (heads/jetspec.py).

Every head has the same serving interface (`new_cache`, `truncate`, `extend`, `draft`), so one
drafter (drafters/parallel_head.py) serves them all. No vLLM imports: the engine hands a head the
target features it gathered (engine/), the head returns per-depth log-probs, and the tree
builders (tree/) shape them.
"""
from __future__ import annotations

from vllm_treespec.drafters.heads.dart import DartConfig, DartHead
from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

__all__ = ["HEAD_KINDS", "HeadConfig", "DraftHead"]

# checkpoint config.json "kind" -> (config class, head class)
HEAD_KINDS: dict[str, tuple[type, type]] = {"dart": (DartConfig, DartHead),
                                            "jetspec": (JetSpecConfig, JetSpecHead)}
HeadConfig = DartConfig | JetSpecConfig
DraftHead = DartHead | JetSpecHead
