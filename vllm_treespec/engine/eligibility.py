"""Which requests tree verification serves exactly, and why the others decode normally.

Tree acceptance (verify/accept.py) reproduces vLLM's sampler for temperature, top-k, top-p and
min-p. Everything else vLLM's sampler does is either batch state built for linear drafts
(penalties and bad words read the request's output plus its *chain* of draft tokens; grammar
bitmasks are built along the chain) or output we do not produce (logprobs of draft rows). A
request that uses any of them gets no drafts while it does, and vLLM's own sampler serves it:
exact, only without speculation. The reason is counted per request in the proposer's stats.
"""
from __future__ import annotations

from typing import Any

from vllm_treespec.engine.request_options import is_option_key

__all__ = ["tree_blocker", "static_blocker", "pending_min_tokens", "STATIC_BLOCKERS"]

# (attribute, value meaning "not used", reason) — request options fixed for a request's life.
STATIC_BLOCKERS: tuple[tuple[str, Any, str], ...] = (
    ("logprobs", None, "logprobs"),
    ("logprob_token_ids", None, "logprobs"),
    ("presence_penalty", 0.0, "penalties"),
    ("frequency_penalty", 0.0, "penalties"),
    ("repetition_penalty", 1.0, "penalties"),
    ("bad_words", None, "bad_words"),
    ("logit_bias", None, "logit_bias"),
    ("allowed_token_ids", None, "allowed_token_ids"),
    ("structured_outputs", None, "structured_output"),
    ("extra_args", None, "logits_processor_args"),
    ("watermarking", None, "watermarking"),
    ("thinking_token_budget", None, "thinking_token_budget"),
    ("repetition_detection", None, "repetition_detection"),
)


def static_blocker(params: Any) -> str | None:
    """The first request option trees cannot honour exactly, or None."""
    if params is None:          # pooling requests never decode
        return "no_sampling_params"
    for attr, unused, reason in STATIC_BLOCKERS:
        value = getattr(params, attr, unused)
        if attr == "extra_args" and isinstance(value, dict):
            # our own per-request options (engine/request_options.py) feed no logits processor
            value = {k: v for k, v in value.items() if not is_option_key(k)}
        if _used(value, unused):
            return reason
    return None


def _used(value: Any, unused: Any) -> bool:
    if value is None:
        return unused is not None
    if isinstance(value, (dict, list, tuple, set)) and not value:
        return False
    if isinstance(value, bool) and unused is None:   # e.g. watermarking=False
        return value
    return value != unused


def tree_blocker(params: Any, num_output_tokens: int) -> str | None:
    """Why this request gets no drafts this step (None = draft and verify it as a tree).

    min_tokens: until it is reached vLLM masks EOS and stop tokens per row; that mask is
    batch state we do not apply to tree rows, so such requests wait until it no longer applies.
    """
    reason = static_blocker(params)
    if reason is None and pending_min_tokens(params, num_output_tokens):
        return "min_tokens"
    return reason


def pending_min_tokens(params: Any, num_output_tokens: int) -> bool:
    """True while vLLM still masks EOS / stop tokens for the request's min_tokens."""
    return num_output_tokens < int(getattr(params, "min_tokens", 0) or 0)
