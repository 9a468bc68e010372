"""Compile every Triton kernel for a CUDA target without a GPU (Triton's bundled ptxas).

The interpreter tests check the kernels' arithmetic; this checks that the same source passes
the real compiler (the interpreter accepts code the compiler rejects) and reports registers and
spill stack per variant, with the 16-divisibility hints the JIT gives aligned pointers and
strides at run time. Must run without TRITON_INTERPRET (tests run it in a subprocess):

    python -m vllm_treespec.kernels.compile_check [--arch 90]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["compile_all"]


def _compile(fn: Any, types: dict[str, str], constexprs: dict[str, Any], arch: int,
             warps: int, stages: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if n not in constexprs and (sig[n].startswith("*") or n.startswith("stride"))}
    src = ASTSource(fn=fn, signature=sig, attrs=aligned,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": warps, "num_stages": stages})
    return {"shared_bytes": kernel.metadata.shared, **_resources(kernel.asm["cubin"])}


def _resources(cubin: bytes) -> dict[str, Any]:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, timeout=60).stdout
    for line in out.splitlines():
        if "REG:" in line:
            fields = dict(x.split(":", 1) for x in line.split() if ":" in x)
            return {"registers": int(fields["REG"]), "stack_bytes": int(fields["STACK"])}
    return {}


def compile_all(arch: int = 90) -> list[dict[str, Any]]:
    """Compile the shipped variants; one record per variant (raises on a compile error)."""
    import torch
    import triton.language as tl

    from vllm_treespec.kernels import kv_compaction, tree_accept, tree_attention as ta

    out = []
    ptrs = {"block_table": "*i32", "prefix_lens": "*i64", "q_offsets": "*i64",
            "anc_mask": "*i64", "causal": "*i32", "PartOut": "*fp32", "PartLse": "*fp32",
            "sm_scale": "fp32", "soft_cap": "fp32"}
    for dtype, d, splits, causal, cap in [("bf16", 128, 1, False, False),
                                          ("fp16", 64, 4, True, True),
                                          ("bf16", 256, 2, False, False),
                                          ("fp32", 64, 1, False, False)]:
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        bm, bn, warps, stages = ta.default_config(d, torch_dtype[dtype])
        types = {**ptrs, **{n: f"*{dtype}" for n in ("Q", "K", "V", "Out")}}
        const = dict(BLOCK_SIZE=16, GROUP=4, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=bn,
                     NUM_SPLITS=splits, HAS_CAUSAL=causal, SOFT_CAP=cap, UPCAST=False,
                     PRECISION="ieee" if dtype == "fp32" else "tf32")
        rec = _compile(ta._tree_attn_kernel, types, const, arch, warps, stages)
        out.append({"kernel": f"tree_attention {dtype} d{d} {bm}x{bn} splits {splits} "
                              f"warps {warps}", **rec})
    rec = _compile(ta._merge_kernel, {"PartOut": "*fp32", "PartLse": "*fp32", "Out": "*bf16"},
                   dict(NUM_SPLITS=5, BLOCK_S=8, HEAD_DIM=128, BLOCK_D=128), arch, 4, 1)
    out.append({"kernel": "tree_attention merge", **rec})
    i64 = {n: "*i64" for n in ("offsets", "tokens", "parents", "target", "emitted", "nodes",
                               "num_emitted")}
    rec = _compile(tree_accept._greedy_accept_kernel, i64, dict(BLOCK_N=256), arch, 4, 1)
    out.append({"kernel": "greedy_tree_accept 256 nodes", **rec})
    for word in (tl.int64, tl.int8):
        types = {"ptrs": "*i64", "src": "*i64", "dst": "*i64"}
        types |= {n: "i64" for n in kv_compaction._compact_kernel.arg_names if n not in types}
        rec = _compile(kv_compaction._compact_kernel, types,
                       dict(BLOCK_SIZE=16, WORD=word, BLOCK_J=16, BLOCK_C=256), arch, 4, 1)
        out.append({"kernel": f"kv_compaction {word}", **rec})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="SM version, e.g. 90 for H100")
    ns = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter does not compile", file=sys.stderr)
        return 2
    for rec in compile_all(ns.arch):
        print(f"sm_{ns.arch} {rec['kernel']:<48} regs {rec.get('registers', '?'):>4} "
              f"stack {rec.get('stack_bytes', '?'):>5} B  shared {rec['shared_bytes']:>6} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
