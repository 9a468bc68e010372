"""The drafter interface: what the proposer hands a drafter each step and what it gets back."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from vllm_treespec.tree import DraftTree

if TYPE_CHECKING:
    from vllm_treespec.drafters.draft_sampling import DraftProbs


@dataclass(frozen=True)
class DrafterCapabilities:
    """What a drafter needs from the proposer beyond the token buffer, declared by the drafter
    (a class attribute, or set in `__init__` where it depends on the config) so the proposer
    reads it instead of probing for attributes."""
    uses_target_states: bool = False   # DraftInputs.target: the target's hidden states this step
    aux_layers: tuple[int, ...] = ()   # vLLM aux hidden-state layer ids it reads (id j = output of layer j - 1)
    samples_drafts: bool = False       # DraftInputs.sampling is set; Proposal.draft_probs may be
    reads_sampling: bool = False       # DraftInputs.sampling is set (drafts chosen per temperature)
    observes_output: bool = False      # `observe_output` gets every finished request's output


@dataclass
class TargetStates:
    """The target's hidden states from this step's forward, for drafters that condition on them
    (draft models with shared features, DART / JetSpec heads, DFlash drafters).

    `hidden` is [num_step_tokens, H] (last layer, the step's flat token rows), `aux` the extra
    layers' states when the runner collects them (vLLM's aux hidden-state layers), and `rows[i]`
    the flat rows of the tokens request i committed this step, in order: the verified root and
    its accepted tree path (decodes), or its prompt chunk (prefills); `positions[i]` their token
    positions (contiguous: accepted tree nodes sit at num_computed + depth).
    """
    hidden: Any
    aux: Sequence[Any] | None
    rows: Sequence[np.ndarray]
    positions: Sequence[np.ndarray] | None = None   # the token position of each of those rows


@dataclass
class DraftInputs:
    """One step's drafting inputs for the requests that decode this step.

    `token_ids` is the engine's token buffer (read-only view, [rows, max_len] int32); request i
    owns row `rows[i]`, whose first `num_tokens[i]` entries are its prompt and output so far
    (including the token sampled this step, which becomes the root of its tree). `budgets[i]`
    is the most draft nodes request i may get this step (0 = draft nothing). `tree_overrides`
    are this step's overrides of the tree section (a budget.table rule's max_depth and builder
    keys, e.g. {"max_depth": 4, "topk": 2}); empty = the tree section as configured.
    """
    req_ids: Sequence[str]
    token_ids: np.ndarray
    rows: np.ndarray
    num_tokens: np.ndarray
    budgets: np.ndarray
    target: TargetStates | None = None   # set for drafters whose capabilities say uses_target_states
    # per request its SamplingParams (temperature, top_k, top_p, min_p, seed; None = unknown),
    # set for drafters whose capabilities say samples_drafts or reads_sampling
    sampling: Sequence[Any] | None = None
    tree_overrides: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.req_ids)

    def tree_params(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """This step's tree keys: `base` (the drafter's tree section) with `tree_overrides`."""
        return {**base, **self.tree_overrides}

    def max_depth(self, default: int) -> int:
        """This step's deepest tree level: a table rule's max_depth, else `default`."""
        return int(self.tree_overrides.get("max_depth", default))

    def root(self, i: int) -> int:
        """Request i's root token: its last token (sampled this step)."""
        return int(self.token_ids[int(self.rows[i]), int(self.num_tokens[i]) - 1])

    def context(self, i: int, length: int) -> np.ndarray:
        """Request i's last `length` tokens, root included."""
        end = int(self.num_tokens[i])
        return self.token_ids[int(self.rows[i]), max(0, end - length): end]


def split_flat_trees(tokens: np.ndarray, parents: np.ndarray, depth: np.ndarray, logprob: np.ndarray,
                     score: np.ndarray, counts: np.ndarray, source: np.ndarray | None = None) -> list[DraftTree]:
    """DraftTrees from the C++ drafters' flat output: request i's block holds counts[i] + 1
    root-first entries, parents local to the block (trusted: built by the C++ cores); `source`
    (int8, optional) says per node what rated it (DraftTree.source)."""
    trees, start = [], 0
    for count in np.asarray(counts).tolist():
        end = start + count + 1
        trees.append(DraftTree(tokens[start:end], parents[start:end], depth[start:end],
                               logprob[start:end], score[start:end], validate=False,
                               source=None if source is None else source[start:end]))
        start = end
    return trees


def chain_trees(inputs: DraftInputs, chains: Sequence[Sequence[int]]) -> list[DraftTree]:
    """Trees from linear drafts (chains[i] drafted after request i's root)."""
    trees = []
    for i, chain in enumerate(chains):
        root = inputs.root(i) if inputs.num_tokens[i] > 0 else 0
        trees.append(DraftTree.chain(root, chain))
    return trees


@dataclass
class Proposal:
    """A drafter's answer for one step: `trees[i]` for request i (root-only = no drafts), and for
    the trees whose children were drawn from the drafter's q (samples_drafts) `draft_probs[i]`,
    their q rows (drafters/draft_sampling.py): those nodes are verified by recursive rejection
    sampling, all others by the target-only rule."""
    trees: list[DraftTree]
    draft_probs: dict[int, "DraftProbs"] = field(default_factory=dict)


class Drafter(ABC):
    """Proposes a tree per request each step. Subclasses set `name` and, where they need more
    than the token buffer, `capabilities`; the per-request hooks default to stateless."""
    name: str
    capabilities: DrafterCapabilities = DrafterCapabilities()

    def load(self, target_model: Any) -> None:
        """Called once with the target model (drafters that share its weights use it)."""

    @abstractmethod
    def propose(self, inputs: DraftInputs) -> Proposal:
        """One tree per request, rooted at its last token, with at most budgets[i] draft nodes
        in topological order (root-only = no drafts this step)."""

    def observe_output(self, tokens: np.ndarray) -> None:
        """A finished request's output tokens (called where `capabilities.observes_output`)."""
        raise NotImplementedError(f"{type(self).__name__} declares observes_output without observe_output")

    def on_requests_finished(self, req_ids: Sequence[str]) -> None:
        """Forget per-request state of finished or aborted requests (none by default)."""

    def tracked_requests(self) -> dict[str, int]:
        """Requests each per-request table holds (a leak check: all 0 once every request
        finished); {} for drafters without per-request state."""
        return {}
