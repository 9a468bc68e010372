"""Building a trie file: shard inputs over processes, count in C++, merge into the frozen format.

Pipeline: input files are split into `workers` shards of similar byte size; each shard's process
tokenises its files and feeds the streams to a C++ Counter, which spills sorted count runs to a
scratch directory whenever its share of `memory_mb` fills; the parent then k-way merges all runs
into the frozen file (written to a temporary name and renamed, so readers never see a partial
file and processes still mapping an old version keep it). The output depends only on the
inputs and options, never on workers, spills or timing: same inputs, same bytes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from vllm_treespec.native import native
from vllm_treespec.ngram.inputs import DEFAULT_GLOBS, expand_inputs, input_kind, read_documents, read_ids

MAX_ORDER: int = native().ngram.MAX_ORDER


@dataclass(frozen=True)
class BuildOptions:
    order: int = 3
    min_count: int = 1
    workers: int = 1
    memory_mb: float = 1024.0
    vocab_size: int | None = None   # default: the tokenizer's (or max id + 1 without one)
    tmp_dir: str | None = None      # scratch runs; default: next to the output file
    progress: bool = False
    top_threshold: int = 16
    top_cap: int = 32
    dense_threshold: int | None = None  # children for a bitmap index; None: 3 * ceil(vocab / 64), 0: off
    max_count_bits: int = 32        # lower only in tests, to exercise count scaling

    def check(self) -> None:
        if not 1 <= self.order <= MAX_ORDER:
            raise ValueError(f"--order must be in 1..{MAX_ORDER}, got {self.order}")
        if self.min_count < 1:
            raise ValueError(f"--min-count must be >= 1, got {self.min_count}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.memory_mb <= 0:
            raise ValueError(f"--memory-mb must be > 0, got {self.memory_mb}")


@dataclass
class ShardResult:
    runs: list[str]
    tokens: int
    max_token: int
    spills: int


def _shards(files: Sequence[Path], n: int) -> list[list[Path]]:
    """Split files into n shards of similar total size (largest first, deterministic)."""
    sized = sorted(((f.stat().st_size, i, f) for i, f in enumerate(files)), key=lambda x: (-x[0], x[1]))
    shards: list[list[tuple[int, Path]]] = [[] for _ in range(n)]
    loads = [0] * n
    for size, i, f in sized:
        j = min(range(n), key=lambda s: (loads[s], s))
        shards[j].append((i, f))
        loads[j] += size
    return [[f for _, f in sorted(s)] for s in shards if s]


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def count_files(files: Sequence[Path], tokenizer_path: str | None, order: int, memory_bytes: int,
                spill_prefix: str, on_file: Callable[[int], None] = lambda _: None) -> ShardResult:
    """Count the n-grams of `files` (one shard) into sorted run files."""
    counter = native().ngram.Counter(order, memory_bytes, spill_prefix)
    tok = None
    if tokenizer_path is not None:
        from vllm_treespec.ngram.tokenizer import encode_batch, load_tokenizer

        tok = load_tokenizer(tokenizer_path)
    for f in files:
        if input_kind(f) == "ids":
            counter.add(read_ids(f))
        else:
            if tok is None:
                raise ValueError(f"{f} is text; pass --tokenizer MODEL_DIR to tokenise it")
            for docs in _batches(read_documents(f), 256):
                for ids in encode_batch(tok, docs):
                    counter.add(np.asarray(ids, dtype=np.int32))
        on_file(f.stat().st_size)
    runs = counter.finish()
    return ShardResult(runs=list(runs), tokens=counter.tokens, max_token=counter.max_token, spills=counter.spills)


def _worker(index: int, files: list[Path], tokenizer_path: str | None, order: int, memory_bytes: int,
            spill_dir: str, q: Any) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        result = count_files(files, tokenizer_path, order, memory_bytes, f"{spill_dir}/shard{index:03d}-",
                             on_file=lambda n: q.put(("file", index, n)))
        q.put(("done", index, result))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        q.put(("error", index, traceback.format_exc()))


def _count_parallel(shards: list[list[Path]], tokenizer_path: str | None, order: int, memory_bytes: int,
                    spill_dir: str, on_file: Callable[[int], None]) -> list[ShardResult]:
    ctx = mp.get_context("spawn")  # tokenizers' thread pool does not survive fork
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, s, tokenizer_path, order, memory_bytes, spill_dir, q), daemon=True)
             for i, s in enumerate(shards)]
    for p in procs:
        p.start()
    results: dict[int, ShardResult] = {}
    try:
        while len(results) < len(procs):
            try:
                kind, index, payload = q.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs) if i not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(
                        f"n-gram build worker {dead[0]} died (exit code {procs[dead[0]].exitcode}); workers are "
                        "spawned, so a script calling build_trie(workers > 1) needs `if __name__ == '__main__':`")
                continue
            if kind == "file":
                on_file(payload)
            elif kind == "done":
                results[index] = payload
            else:
                raise RuntimeError(f"n-gram build worker {index} failed:\n{payload}")
    finally:
        for p in procs:
            if p.is_alive() and len(results) < len(procs):
                p.terminate()
            p.join()
    return [results[i] for i in range(len(procs))]


def _freeze(runs: list[str], out: Path, opts: BuildOptions, vocab: int, fingerprint: bytes, tok_name: str,
            spill_dir: str) -> dict[str, Any]:
    """Merge the runs into the trie file `out` (with a merge progress bar when asked)."""
    from tqdm import tqdm

    with tqdm(total=1, unit="rec", unit_scale=True, desc="merge", disable=not opts.progress) as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        return native().ngram.freeze(
            runs, str(out), opts.order, vocab, min_count=opts.min_count, top_threshold=opts.top_threshold,
            top_cap=opts.top_cap, dense_threshold=-1 if opts.dense_threshold is None else opts.dense_threshold,
            fingerprint=fingerprint, tokenizer_name=tok_name, tmp_dir=spill_dir,
            memory_bytes=int(opts.memory_mb * (1 << 20)), max_count_bits=opts.max_count_bits,
            progress=progress if opts.progress else None)


def build_trie_from_streams(streams: Iterable[Sequence[int] | np.ndarray], out: str | Path, *,
                            fingerprint: str | None = None, tokenizer_name: str = "",
                            **options: Any) -> dict[str, Any]:
    """Build the trie file `out` from in-memory token streams (one process; each stream a document).

    For token ids already in hand (served outputs, tests). `fingerprint` (hex) stamps the header
    like --tokenizer does; options are BuildOptions fields (order, min_count, memory_mb, ...).
    """
    opts = BuildOptions(**options)
    opts.check()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    spill_dir = tempfile.mkdtemp(prefix=".ngram-build-", dir=Path(opts.tmp_dir) if opts.tmp_dir else out.parent)
    try:
        counter = native().ngram.Counter(opts.order, int(opts.memory_mb * (1 << 20)), f"{spill_dir}/mem-")
        for s in streams:
            counter.add(np.ascontiguousarray(s, dtype=np.int32).reshape(-1))
        runs = list(counter.finish())
        vocab = opts.vocab_size or max(1, counter.max_token + 1)
        if counter.max_token >= vocab:
            raise ValueError(f"token id {counter.max_token} is not below the vocabulary size {vocab}")
        stats = _freeze(runs, out, opts, vocab, bytes.fromhex(fingerprint or ""), tokenizer_name, spill_dir)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    return {**stats, "tokens": counter.tokens, "spill_runs": counter.spills,
            "bytes_per_node": stats["file_bytes"] / stats["num_nodes"]}


def empty_tries(order: int, vocab_size: int, handles: int = 1) -> list[Any]:
    """`handles` independent handles on one trie with no corpus: the frozen part of the
    model-free lookup trie (drafter.path null), whose online layer learns from served outputs
    (what SuffixDecoding's global tree is to vLLM's `suffix`). Handles share the mapping but not
    an online layer, so one may learn while another stays frozen.

    The query code reads a frozen file plus the online layer, so the frozen part is an empty file
    (one root node, ~17 KB) built into a temporary directory, mapped, and unlinked at once: the
    mappings keep it alive for this process and nothing is left on disk.
    """
    from vllm_treespec.ngram.trie import NgramTrie

    scratch = tempfile.mkdtemp(prefix="treespec-online-trie-")
    try:
        path = Path(scratch) / "empty.trie"
        build_trie_from_streams([], path, order=order, vocab_size=vocab_size, memory_mb=1)
        return [NgramTrie.load(path) for _ in range(handles)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _tokenizer_meta(tokenizer: str | Path | None) -> tuple[str | None, int | None, bytes, str]:
    """(path, vocab size, fingerprint bytes, name) of the tokenizer, or blanks without one."""
    if tokenizer is None:
        return None, None, b"", ""
    from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint
    from vllm_treespec.ngram.tokenizer import load_tokenizer, tokenizer_name, vocab_size

    tok = load_tokenizer(tokenizer)
    return str(tokenizer), vocab_size(tok), bytes.fromhex(tokenizer_fingerprint(tok)), tokenizer_name(tokenizer)


def build_trie(inputs: Iterable[str | Path], out: str | Path, tokenizer: str | Path | None = None,
               options: BuildOptions | None = None, *, globs: Sequence[str] | None = None,
               **overrides: Any) -> dict[str, Any]:
    """Build the trie file `out` from `inputs` (files or directories); returns a build report.

    `tokenizer` (a Hugging Face model or tokenizer directory) is required for text inputs and
    stamps its fingerprint and vocabulary size into the header. Options may also be passed as
    keyword arguments (order=5, workers=2, ...). `globs` selects files inside input directories.
    """
    opts = BuildOptions(**{**(options.__dict__ if options else {}), **overrides})
    opts.check()
    out = Path(out)
    files = expand_inputs(inputs, globs or DEFAULT_GLOBS)
    if not files:
        raise ValueError("no input files (directories are searched for *.py, *.txt, *.jsonl, *.npy, ...)")
    tok_path, tok_vocab, fingerprint, tok_name = _tokenizer_meta(tokenizer)
    if tok_path is None and any(input_kind(f) != "ids" for f in files):
        raise ValueError("text inputs need --tokenizer MODEL_DIR")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch_root = Path(opts.tmp_dir) if opts.tmp_dir else out.parent
    scratch_root.mkdir(parents=True, exist_ok=True)
    spill_dir = tempfile.mkdtemp(prefix=".ngram-build-", dir=scratch_root)
    memory_bytes = int(opts.memory_mb * (1 << 20))
    total_bytes = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    try:
        from tqdm import tqdm

        with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="count", disable=not opts.progress) as bar:
            # A daemonic process (a vLLM worker resolving a fixture trie) may not start children.
            workers = 1 if mp.current_process().daemon else opts.workers
            shards = _shards(files, min(workers, len(files)))
            if len(shards) == 1:
                results = [count_files(shards[0], tok_path, opts.order, memory_bytes, f"{spill_dir}/shard000-",
                                       on_file=bar.update)]
            else:
                results = _count_parallel(shards, tok_path, opts.order, memory_bytes // len(shards), spill_dir,
                                          bar.update)
        t_count = time.perf_counter() - t0
        max_token = max(r.max_token for r in results)
        vocab = opts.vocab_size or tok_vocab or max(1, max_token + 1)
        if max_token >= vocab:
            raise ValueError(f"token id {max_token} is not below the vocabulary size {vocab}")
        runs = sorted(p for r in results for p in r.runs)
        stats = _freeze(runs, out, opts, vocab, fingerprint, tok_name, spill_dir)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    seconds = time.perf_counter() - t0
    tokens = sum(r.tokens for r in results)
    return {
        "out": str(out), "files": len(files), "input_bytes": total_bytes, "tokens": tokens,
        "order": opts.order, "min_count": opts.min_count, "workers": len(shards), "vocab_size": vocab,
        "spill_runs": sum(r.spills for r in results), "count_seconds": round(t_count, 3),
        "merge_seconds": round(seconds - t_count, 3), "seconds": round(seconds, 3),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "num_nodes": stats["num_nodes"], "file_bytes": stats["file_bytes"],
        "bytes_per_node": stats["file_bytes"] / stats["num_nodes"], "level_sizes": stats["level_sizes"],
        "count_shift": stats["count_shift"], "intermediate_merges": stats["intermediate_merges"],
        "tokenizer": tok_name, "tokenizer_fingerprint": fingerprint.hex() or None,
    }
