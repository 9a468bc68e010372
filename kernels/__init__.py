"""Triton kernels for GPU verification: kernels/ in the checkout, installed as
`vllm_treespec.kernels` (setup.py's PACKAGE_DIRS).

Each kernel has a thin Python wrapper; its torch reference (benchmarks/harness/kernel_reference.py)
and test cases (tests/support/kernel_cases.py) stay in the lab, and the tests run the kernels on
CPU with TRITON_INTERPRET=1. Importing this package must not require a GPU, and it
imports no kernel module (nor Triton) by itself:

- ``tree_attention``: paged tree attention for verification rows (split-KV prefix, bitmask tree
  part, LSE merge) over vLLM's FlashAttention KV layout;
- ``kv_compaction``: accepted nodes' K/V to their chain slots, all layers in one launch;
- ``tree_accept``: greedy tree acceptance, one program per request;
- ``cuda_ops``: wrappers of the opt-in CUDA extension (csrc/cuda/), same contracts;
- ``compile_check``: compiles every Triton variant for an sm target without a GPU.

Design notes, H100 measurements and the predictions they replaced: NOTES.md beside this file.
"""
