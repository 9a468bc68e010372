"""Whether the Triton kernels can run here, and in which mode (kernel tests and GPU scripts).

Without a GPU the kernels run in Triton's CPU interpreter, which triton 3.9 selects per
``@triton.jit`` decoration from ``TRITON_INTERPRET``; its own library kernels (``tl.sum``,
``tl.cdiv``, ...) are decorated when triton is first imported, and an interpreted kernel cannot
call compiled-mode ones. So the variable must be set before anything imports triton (vLLM does
on import): tests/conftest.py sets it for the session when there is no CUDA device.
"""
from __future__ import annotations

import os
import sys

import torch

__all__ = ["interpreted", "triton_mode_problem"]


def interpreted() -> bool:
    """True when kernels must run in Triton's CPU interpreter (no CUDA device)."""
    return not torch.cuda.is_available()


def triton_mode_problem() -> str | None:
    """Why the kernels cannot run here (a skip message), or None when they can."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not interpreted():
        return None
    from triton import knobs

    if not knobs.runtime.interpret:
        return "no CUDA device and TRITON_INTERPRET is not 1 (tests/conftest.py sets it)"
    if "triton.language" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET changed after triton was imported"
    from triton.language import standard

    if type(standard.cdiv).__name__ != "InterpretedFunction":
        return ("triton was imported before TRITON_INTERPRET=1 was set, so its library "
                "kernels are not interpretable; set it before anything imports triton")
    return None
