"""Shadow probes: a stopped request's probe draft checked against the tokens the request goes on
to produce, instead of being verified in a speculative step.

Why: a verified probe makes its whole step speculative. At one sampled client a speculative
step costs about 2 ms more than a plain one outside the model (docs/never-slower.md section 4,
`profile_step_parts` records), and a 2-node probe at temperature 0.7 accepts 0.29 tokens: the
probes were the one point the default lost against drafting turned off.

Why it measures the same thing. For drafts verified by the target-only rule (drafts without the
drafter's q: verify/accept.py), verification draws the token at a node from the target's
processed distribution p and accepts the child carrying it. Plain decoding draws the next token
from the same p. So walking the probe tree with the tokens the request samples next accepts,
in distribution, exactly the path a verification would (greedy: exactly the same path). Drafts
verified against their drafter's q (recursive rejection) accept more than this rule, and seeded
requests decide on their own verified history: both keep verified probes (budget_control).

Pure Python and numpy: no vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vllm_treespec.tree.draft_tree import DraftTree

__all__ = ["ShadowProbe"]


@dataclass
class ShadowProbe:
    """A probe tree kept back from verification. `start`: the request's token count when it was
    drafted (its root is token start - 1, so the tokens from index `start` on are what the
    request produced since); `accepted`/`node`: the walk so far (settled in steps)."""
    tree: DraftTree
    start: int
    accepted: int = 0
    node: int = 0

    def settle(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """(deepest depth of the tree, accepted nodes) once the request's tokens since `start`
        decide the walk (a token no child carries, or a leaf reached), else None: it needs more
        tokens. `tokens`: all the request produced since `start`, in order."""
        parents, node_tokens = self.tree.parents.tolist(), self.tree.tokens.tolist()
        for token in list(tokens)[self.accepted:]:
            child = next((c for c in range(self.node + 1, len(parents))
                          if parents[c] == self.node and node_tokens[c] == token), None)
            if child is None:
                return self.tree.max_depth, self.accepted
            self.node, self.accepted = child, self.accepted + 1
        if self.node not in parents:                 # a leaf: nothing deeper to accept
            return self.tree.max_depth, self.accepted
        return None
