"""An explicit, checked registry of the vLLM methods this plugin wraps.

Each patch names its target (`module:Class.method`), the exact signature it expects (so a vLLM bump
that changes a wrapped private method fails loudly in the signature test instead of misbehaving),
and a factory that receives the original function and returns the replacement. Installing a target
twice is an error; `uninstall_all()` restores originals (tests use it).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable


class PatchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Patch:
    target: str                      # "package.module:Class.method"
    expected_signature: str          # str(inspect.signature(original))
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    why: str

    def resolve(self) -> tuple[Any, str, Callable[..., Any]]:
        module_name, _, qualname = self.target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        if original is None:
            raise PatchError(f"patch target {self.target} does not exist in this vLLM build")
        return owner, attr, original


class PatchRegistry:
    def __init__(self) -> None:
        self._patches: dict[str, Patch] = {}
        self._installed: dict[str, tuple[Any, str, Any]] = {}

    def register(self, patch: Patch) -> None:
        if patch.target in self._patches:
            raise PatchError(f"patch target {patch.target} is registered twice")
        self._patches[patch.target] = patch

    @property
    def patches(self) -> list[Patch]:
        return list(self._patches.values())

    def signature_mismatches(self, patches: Iterable[Patch] | None = None) -> list[str]:
        """Targets whose current signature differs from the one the patch was written for (of
        `patches`, default every registered patch)."""
        problems = []
        for p in self._patches.values() if patches is None else patches:
            _, _, original = p.resolve()
            actual = str(inspect.signature(original))
            if actual != p.expected_signature:
                problems.append(f"{p.target}: expected {p.expected_signature}, found {actual}")
        return problems

    def install_all(self) -> None:
        mismatches = self.signature_mismatches()
        if mismatches:
            raise PatchError("vLLM internals changed under vllm_treespec's patches: " + "; ".join(mismatches))
        for p in self._patches.values():
            self.install(p)

    def install(self, patch: Patch) -> None:
        if patch.target in self._installed:
            raise PatchError(f"{patch.target} is already patched; patching twice would wrap the wrapper")
        owner, attr, original = patch.resolve()
        if getattr(original, "__treespec_patch__", None):
            raise PatchError(f"{patch.target} already carries a vllm_treespec patch")
        replacement = patch.make(original)
        functools.update_wrapper(replacement, original)
        replacement.__treespec_patch__ = patch.target  # type: ignore[attr-defined]
        setattr(owner, attr, replacement)
        self._installed[patch.target] = (owner, attr, original)

    def is_installed(self, target: str) -> bool:
        return target in self._installed

    def uninstall_all(self) -> None:
        for owner, attr, original in self._installed.values():
            setattr(owner, attr, original)
        self._installed.clear()
