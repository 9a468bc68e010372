"""Per-request speculation control through the request's extra arguments.

An OpenAI client sends `"vllm_xargs": {"treespec_max_nodes": 0}` (offline:
`SamplingParams(extra_args={"treespec_max_nodes": 0})`) to opt a request out of speculation, or
a positive value to cap its draft nodes per step below the deployment's budget (flat keys:
vLLM's OpenAI server accepts only scalars and lists as `vllm_xargs` values). Why: the
operator sets one budget per deployment, but a client knows when a request will not repeat itself
(free-form sampling) or is latency-critical, and neither vLLM nor SGLang lets it say so.

The options are checked where vLLM checks a request's `extra_args` (`SamplingParams`
construction, in the API server before the request is admitted), so a bad value is a 400
naming the key, never a worker crash. That one patch is installed by the plugin's `register()`
in every process; it only acts on requests that carry a `treespec_*` key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vllm_treespec.engine.patch_registry import Patch, PatchRegistry

PREFIX = "treespec_"           # vllm_xargs values must be scalars or lists: flat, prefixed keys
ALLOWED = {"treespec_max_nodes": "int >= 0 (0 = no drafts for this request; N = at most N draft "
                                 "nodes per step)"}

REGISTRY = PatchRegistry()


class RequestOptionError(ValueError):
    pass


@dataclass(frozen=True)
class RequestOptions:
    max_nodes: int | None = None     # None: the deployment's budget


def is_option_key(key: object) -> bool:
    """True for the extra_args keys this plugin owns (they feed no logits processor)."""
    return isinstance(key, str) and key.startswith(PREFIX)


def parse_request_options(extra_args: Mapping[str, Any] | None) -> RequestOptions:
    """The request's treespec options; RequestOptionError naming the key for a bad value."""
    if not extra_args:
        return RequestOptions()
    ours = {k: v for k, v in extra_args.items() if is_option_key(k)}
    unknown = sorted(set(ours) - set(ALLOWED))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in ALLOWED.items())
        raise RequestOptionError(f"extra_args.{unknown[0]}: unknown key; allowed: {allowed}")
    max_nodes = ours.get("treespec_max_nodes")
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int)
                                  or max_nodes < 0):
        raise RequestOptionError(
            f"extra_args.treespec_max_nodes: {max_nodes!r} is not a node count; use an integer "
            ">= 0 (0 turns speculation off for this request)")
    return RequestOptions(max_nodes=max_nodes)


def _wrap_verify_extra_args(original: Callable[..., Any]) -> Callable[..., Any]:
    def _verify_extra_args(self) -> None:
        original(self)
        try:
            parse_request_options(self.extra_args)
        except RequestOptionError as e:
            from vllm.exceptions import VLLMValidationError

            raise VLLMValidationError(str(e), parameter="extra_args") from None

    return _verify_extra_args


REGISTRY.register(Patch(
    target="vllm.sampling_params:SamplingParams._verify_extra_args",
    expected_signature="(self) -> None",
    make=_wrap_verify_extra_args,
    why="reject bad per-request treespec options with a 400 before the request is admitted",
))


def install() -> None:
    """Install the request check once per process (idempotent; imports vLLM's SamplingParams).
    The plugin's register() calls it only where vLLM already imported SamplingParams (the
    processes that build requests: API server, offline LLM), `activate()` in the worker."""
    for patch in REGISTRY.patches:
        if not REGISTRY.is_installed(patch.target):
            if REGISTRY.signature_mismatches():
                return      # another vLLM: activate() reports the version; requests go unchecked
            REGISTRY.install(patch)
