"""Learned parallel draft heads (issue 8): small modules that read the target's hidden states and
predict several future positions in one forward pass (DART; JetSpec and DFlash-style to come).

No vLLM imports: the engine hands a head the target features it gathered (engine/), the head
returns per-depth log-probs, and the tree builders (tree/) shape them.
"""
