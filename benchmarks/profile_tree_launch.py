"""Where the host time of one tree-attention call goes (a CUDA GPU; kernels/NOTES.md "launch
path"). At one request the GPU finishes a call in 20-30 µs while the host needs 80-100 µs to
issue it, so in eager (piecewise) tree steps the host sets the pace. This splits the call:
the Python wrapper, the raw Triton launch (the kernel with its arguments prepared), and the GPU
time per split count (from a CUDA graph) against the host time of
that split count, plus a cProfile of the wrapper.

    python benchmarks/profile_tree_launch.py --out OUTDIR      # ~30 s on an H100

A/B against another version of the kernel module, timed alternately in one process, e.g. the
rejected fused-merge variant:

    cp kernels/tree_attention.py /tmp/fused.py
    patch /tmp/fused.py benchmarks/variants/tree_attention_fused_merge.patch
    python benchmarks/profile_tree_launch.py --baseline /tmp/fused.py --out OUTDIR
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import Case, graph_ms, host_us  # noqa: E402


def _raw_launch(case: Case, splits: int):
    """The wrapper's Triton launch with every argument computed once up front."""
    import triton

    from vllm_treespec.kernels import tree_attention as ta

    q, kc, vc = case.q, case.key_cache, case.value_cache
    t, hq, d = q.shape
    bs, hkv = kc.shape[1], kc.shape[2]
    bm, bn, warps, stages = ta.default_config(triton.next_power_of_2(d), q.dtype)
    ws = ta.split_workspace(splits, t, hq, d, q.device)
    out = torch.empty_like(q)
    parts, lses = splits * t * hq * d, splits * t * hq
    part_out = ws[:parts].view(splits, t, hq, d) if ws is not None else out
    part_lse = ws[parts:parts + lses].view(splits, t, hq) if ws is not None else out
    grid = (triton.cdiv(case.n * (hq // hkv), bm), case.b * hkv, splits)
    args = (q, kc, vc, out, part_out, part_lse, case.block_table, case.prefix, case.offsets,
            case.anc_mask, case.offsets, float(case.scale), 1.0, hkv, case.anc_mask.shape[1],
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
            vc.stride(0), vc.stride(1), vc.stride(2), out.stride(0), out.stride(1),
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), case.block_table.stride(0),
            case.anc_mask.stride(0))
    meta = dict(BLOCK_SIZE=bs, GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
                BLOCK_M=bm, BLOCK_N=bn, NUM_SPLITS=splits, HAS_CAUSAL=False, SOFT_CAP=False,
                UPCAST=False, PRECISION="tf32", num_warps=warps, num_stages=stages)

    return lambda: ta._tree_attn_kernel[grid](*args, **meta)


def _wrapper(case: Case, splits: int, module=None):
    """The call as the serving backend makes it (splits and scratch made once); `module`: a
    kernels.tree_attention variant to compare (default: the package's)."""
    from vllm_treespec.kernels import tree_attention

    ta = module or tree_attention
    if hasattr(ta, "split_workspace"):
        ws = ta.split_workspace(splits, *case.q.shape, case.q.device)
        extra = {"workspace": ws}
    else:
        extra = {}
    out = torch.empty_like(case.q)
    return lambda: ta.paged_tree_attention(
        case.q, case.key_cache, case.value_cache, case.block_table, case.prefix, case.offsets,
        case.anc_mask, case.scale, max_rows=case.n, max_prefix=case.ctx, num_splits=splits,
        out=out, **extra)


def _load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_tree_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["1x4096x64", "1x16384x16", "8x4096x64"])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--baseline", type=Path, default=None,
                   help="another tree_attention.py to time side by side (alternating, 3 rounds)")
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from vllm_treespec.kernels.tree_attention import default_num_splits

    rows, profiles = [], []
    for shape in ns.shapes:
        b, ctx, n = (int(x) for x in shape.split("x"))
        case = Case(b, ctx, n, 32, 8, 128, torch.bfloat16, 16)
        chosen = default_num_splits(case.q, 8, b, n, ctx)
        row = {"batch": b, "context": ctx, "tree": n, "default_splits": chosen,
               "empty_like_host_us": host_us(lambda: torch.empty_like(case.q)),
               "by_splits": {}}
        for splits in sorted({1, 2, 4, 8, chosen}):
            entry = {"wrapper_host_us": host_us(_wrapper(case, splits)),
                     "raw_launch_host_us": host_us(_raw_launch(case, splits)),
                     "graph_gpu_ms": graph_ms(_wrapper(case, splits))}
            row["by_splits"][splits] = entry
            print(shape, splits, {k: round(v, 4) for k, v in entry.items()}, flush=True)
        if ns.baseline is not None:
            base = _load(ns.baseline)
            ab = {"baseline": [], "current": []}
            for _ in range(3):
                for name, mod in (("baseline", base), ("current", None)):
                    fn = _wrapper(case, chosen, mod)
                    ab[name].append({"host_us": host_us(fn),
                                     "loop_us": host_us(fn, until_done=True),
                                     "graph_gpu_ms": graph_ms(fn)})
            row["ab_default_splits"] = ab
            for name, runs in ab.items():
                med = {k: sorted(r[k] for r in runs)[1] for k in runs[0]}
                print(shape, name, {k: round(v, 4) for k, v in med.items()}, flush=True)
        rows.append(row)
        fn = _wrapper(case, chosen)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        profiles.append(f"== {shape} splits={chosen} (300 calls)\n{text.getvalue()}")
    import triton

    ns.out.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": "profile_tree_launch", "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": triton.__version__,
              "timer": "host: perf_counter over 200 calls without sync; gpu: CUDA graph replay",
              "rows": rows}
    (ns.out / "profile_tree_launch.json").write_text(json.dumps(record, indent=2) + "\n")
    (ns.out / "profile_tree_launch.txt").write_text("\n".join(profiles))
    print("\n".join(profiles)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
