"""The frozen file: header round trip, compactness, and clear errors (never crashes) on bad files."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.dict_trie import DictTrie
from vllm_treespec.ngram import NgramTrie, TokenizerMismatchError, TrieFormatError, build_trie_from_streams
from vllm_treespec.ngram.format import SECTIONS, read_header, rewrite_header

FP = "ab" * 32


@pytest.fixture(scope="module")
def streams() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.zipf(1.3, size=400).clip(1, 60).astype(np.int32) - 1 for _ in range(6)]


@pytest.fixture()
def good(tmp_path, streams) -> Path:
    path = tmp_path / "good.trie"
    build_trie_from_streams(streams, path, order=4, vocab_size=64, fingerprint=FP, tokenizer_name="unit-test",
                            top_threshold=4, top_cap=3)
    return path


def corrupt_bytes(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_header_round_trip(good, streams):
    trie = NgramTrie.load(good, expected_fingerprint=FP, verify=True)
    h = trie.header
    raw = read_header(good)
    assert raw["magic"] == b"TSNGTRIE" and raw["byte_order_mark"] == 0x01020304
    assert (h["order"], h["vocab_size"], h["format_version"]) == (4, 64, 1)
    assert trie.fingerprint == FP and trie.tokenizer_name == "unit-test"
    assert h["total_tokens"] == sum(len(s) for s in streams) == raw["total_tokens"]
    assert h["file_size"] == good.stat().st_size and h["file_size"] % 64 == 0
    assert [raw["section_offset"][s] for s in SECTIONS] == [h["sections"][s][0] for s in SECTIONS]
    assert all(off % 64 == 0 for off in raw["section_offset"].values())
    assert sum(h["level_sizes"]) == trie.num_nodes == DictTrie.build([s.tolist() for s in streams], 4).num_nodes()
    assert h["num_top_nodes"] > 0


def test_bytes_per_node_is_compact(tmp_path):
    rng = np.random.default_rng(0)
    streams = [rng.zipf(1.2, size=20000).clip(1, 4000) - 1 for _ in range(5)]
    report = build_trie_from_streams(streams, tmp_path / "z.trie", order=3, vocab_size=4000)
    assert report["num_nodes"] > 50_000
    assert report["bytes_per_node"] <= 16.0


def expect_error(path: Path, *needles: str, cls: type = TrieFormatError, **kw) -> str:
    with pytest.raises(cls) as info:
        NgramTrie.load(path, **kw)
    msg = str(info.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.mark.parametrize("keep", [0, 7, 100, 511, 512, 600, -64, -1])
def test_truncated_file(good, keep):
    data = good.read_bytes()
    good.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    if 8 <= keep or keep < 0:
        expect_error(good, "truncated")
    else:
        expect_error(good, "not an n-gram trie")


def test_wrong_magic(good):
    corrupt_bytes(good, 0, b"GGUF\0\0\0\0")
    expect_error(good, "bad magic")


def test_future_format_version(good):
    rewrite_header(good, format_version=2)
    expect_error(good, "format version 2 is newer", "upgrade vllm_treespec")


def test_foreign_endianness(good):
    corrupt_bytes(good, 8, struct.pack(">I", 0x01020304))
    expect_error(good, "foreign byte order", "big-endian")


def test_header_bit_flip_fails_the_header_checksum(good):
    corrupt_bytes(good, 400, b"\x01")  # reserved bytes: only the checksum notices
    expect_error(good, "header checksum")


@pytest.mark.parametrize("change", [
    {"section_offset": {"counts": 1 << 40}},
    {"section_offset": {"totals": 513}},
    {"section_offset": {"tokens": 0}},
    {"num_nodes": 1 << 33},
    {"vocab_size": 1 << 30},
    {"order": 9},
    {"level_start": [0, 1, 2, 1, 5, 5, 5, 5, 5, 5]},
    {"num_internal": 3},
])
def test_corrupted_header_fields(good, change):
    rewrite_header(good, **change)  # with a valid header checksum: the field checks must catch it
    expect_error(good, "corrupted header")


def test_overlapping_sections(good):
    offs = read_header(good)["section_offset"]
    rewrite_header(good, section_offset={"totals": offs["first_child"]})
    expect_error(good, "sections overlap")


def test_corrupted_child_offsets_raise_on_use_and_in_verify(good):
    h = read_header(good)
    fc = h["section_offset"]["first_child"]
    n1 = h["level_start"][2] - h["level_start"][1]
    corrupt_bytes(good, fc + 4, struct.pack(f"<{n1}I", *([0xFFFFFF00] * n1)))
    trie = NgramTrie.load(good)  # lazy: load stays O(1)
    with pytest.raises(TrieFormatError, match="corrupt.*children of node"):
        trie.topk([1, 2], 5)
    with pytest.raises(TrieFormatError, match=str(good)):
        trie.verify()


def test_corrupted_unigram_index_and_top_list(good):
    h = read_header(good)
    corrupt_bytes(good, h["section_offset"]["unigram_index"], struct.pack("<I", 10**6))
    trie = NgramTrie.load(good)
    with pytest.raises(TrieFormatError, match="unigram_index"):
        trie.prob([0], [0])
    corrupt_bytes(good, h["section_offset"]["unigram_index"], struct.pack("<I", 0))
    corrupt_bytes(good, h["section_offset"]["top_entries"], struct.pack("<I", 10**6))
    trie = NgramTrie.load(good)
    with pytest.raises(TrieFormatError, match="top list"):
        trie.topk([], 5)


def test_corrupted_dense_index(good):
    h = read_header(good)
    assert h["num_dense_nodes"] > 0 and h["dense_threshold"] == 3  # vocab 64: one word per bitmap
    corrupt_bytes(good, h["section_offset"]["dense_bits"], struct.pack("<Q", (1 << 64) - 1))
    trie = NgramTrie.load(good)
    with pytest.raises(TrieFormatError, match="dense"):
        trie.verify()
    node = struct.unpack_from("<I", good.read_bytes(), h["section_offset"]["dense_nodes"])[0]
    ctx = _path_to(good, node)
    with pytest.raises(TrieFormatError, match="dense index of node"):
        trie.prob_batch([ctx], np.arange(64))


def _path_to(path: Path, node: int) -> list[int]:
    """Tokens of the n-gram a node stands for (walking parents through first_child)."""
    h = read_header(path)
    data = path.read_bytes()
    tokens = np.frombuffer(data, "<i4", h["num_nodes"], h["section_offset"]["tokens"])
    fc = np.frombuffer(data, "<u4", h["num_internal"] + 1, h["section_offset"]["first_child"])
    out = []
    while node != 0:
        out.append(int(tokens[node]))
        node = int(np.searchsorted(fc, node, side="right")) - 1
    return out[::-1]


def test_data_corruption_fails_verify(good):
    h = read_header(good)
    corrupt_bytes(good, h["section_offset"]["counts"] + 40, b"\x7f")
    NgramTrie.load(good)  # counts are not offsets: loading and querying stay safe
    with pytest.raises(TrieFormatError, match="data checksum"):
        NgramTrie.load(good, verify=True)


def test_wrong_tokenizer(good, tmp_path, streams):
    msg = expect_error(good, "was built with tokenizer 'unit-test' abababababababab",
                       "served model uses cdcdcdcdcdcdcdcd", "rebuild with --tokenizer MODEL_DIR",
                       cls=TokenizerMismatchError, expected_fingerprint="cd" * 32)
    assert isinstance(TokenizerMismatchError(msg), ValueError)
    plain = tmp_path / "plain.trie"
    build_trie_from_streams(streams, plain, order=2)
    expect_error(plain, "without a tokenizer fingerprint", cls=TokenizerMismatchError, expected_fingerprint=FP)


def test_missing_and_non_regular_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="ngram build"):
        NgramTrie.load(tmp_path / "nope.trie")
    expect_error(tmp_path, "not a regular file")


FUZZ = textwrap.dedent("""
    import collections, json, os, random, struct, sys
    import numpy as np
    from vllm_treespec.native import native
    from vllm_treespec.ngram import NgramTrie, TrieFormatError

    src, work, cases, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    data = open(src, "rb").read()
    contexts = np.load(os.path.join(work, "contexts.npy"))
    cands = np.arange(-1, 70, dtype=np.int32)
    checksum = native().ngram.checksum64
    rng = random.Random(seed)
    outcomes = collections.Counter()
    progress = open(os.path.join(work, "progress"), "w")
    path = os.path.join(work, "case.trie")
    for i in range(cases):
        buf = bytearray(data)
        if rng.random() < 0.1:
            del buf[rng.randrange(len(buf)):]
        else:
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(512) if rng.random() < 0.4 else rng.randrange(len(buf))
                buf[pos] = rng.randrange(256) if rng.random() < 0.3 else buf[pos] ^ (1 << rng.randrange(8))
        if len(buf) >= 512 and rng.random() < 0.6:  # let field checks and lazy checks do the work
            buf[504:512] = struct.pack("<Q", checksum(bytes(buf[:504])))
        with open(path + ".new", "wb") as f:
            f.write(buf)
        os.replace(path + ".new", path)
        progress.seek(0)
        progress.write(str(i) + "\\n")
        progress.flush()
        stage = "load"
        try:
            t = NgramTrie.load(path)
            stage = "query"
            cur = t.cursors(contexts)
            t.prob_cursors(cur, cands, return_orders=True)
            t.topk_cursors(cur, 4)
            t.topk_cursors(cur, 100)
            t.prob_cursors(t.advance(cur, contexts[:, -1]), cands)
            t.topk_batch(contexts, 3)
            stage = "verify"
            t.verify()
            outcomes["verified"] += 1
        except (TrieFormatError, ValueError) as e:
            outcomes[stage + ":" + type(e).__name__] += 1
    print(json.dumps(outcomes))
""")


@pytest.fixture()
def fast_tmp(tmp_path):
    """A scratch dir in RAM (/dev/shm) when there is one: the fuzz test rewrites a file 12k times."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="ngram-fuzz-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_fuzzed_files_never_crash(fast_tmp, streams):
    """12k random corruptions of a valid file: every outcome is a result or a Python exception."""
    tmp_path = fast_tmp
    src = tmp_path / "src.trie"
    build_trie_from_streams(streams, src, order=4, vocab_size=64, fingerprint=FP, top_threshold=3, top_cap=2)
    ctx = np.stack([s[i:i + 4] for s in streams for i in (0, 50, 100)]).astype(np.int32)
    np.save(tmp_path / "contexts.npy", ctx)
    cases, seed = 12_000, 20240601
    proc = subprocess.run([sys.executable, "-c", FUZZ, str(src), str(tmp_path), str(cases), str(seed)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        last = (tmp_path / "progress").read_text().strip() if (tmp_path / "progress").exists() else "?"
        pytest.fail(f"fuzz subprocess exited with {proc.returncode} at case {last} (seed {seed}):\n"
                    f"{proc.stderr[-3000:]}")
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(outcomes.values()) == cases
    assert outcomes.get("verified", 0) < cases  # the corruptions were noticed...
    assert sum(v for k, v in outcomes.items() if k.startswith("load:")) > cases // 2
    assert any(k.startswith("query:") or k.startswith("verify:") for k in outcomes)  # ...at every stage


SHARE = textwrap.dedent("""
    import json, os, sys
    from vllm_treespec.ngram import NgramTrie
    path = os.path.realpath(sys.argv[1])
    t = NgramTrie.load(path)
    print("ready", flush=True)
    for command in sys.stdin:  # stays mapped until told to exit; an early exit unshares the pages
        if command.strip() == "touch":
            t._t.touch()
            print("touched", flush=True)
        elif command.strip() == "report":
            maps, cur = {}, None
            for line in open("/proc/self/smaps"):
                parts = line.split()
                if len(parts) >= 6 and "-" in parts[0] and parts[5] == path:
                    cur = {"dev": parts[3], "inode": parts[4]}
                    maps.setdefault("regions", []).append(cur)
                elif cur is not None and parts and parts[0].endswith(":") and len(parts) >= 2 and parts[1].isdigit():
                    cur[parts[0][:-1]] = int(parts[1])
                elif len(parts) >= 6 and "-" in parts[0]:
                    cur = None
            print(json.dumps(maps), flush=True)
""")


def _ask(proc: subprocess.Popen, command: str) -> str:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline()


def _smaps_of_two_readers(path: Path) -> list[dict]:
    """Both readers fault in every page, then both report their mapping of the file."""
    procs = [subprocess.Popen([sys.executable, "-c", SHARE, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert _ask(p, "touch").strip() == "touched"
        return [json.loads(_ask(p, "report")) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc smaps")
def test_two_processes_share_one_mapping(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "shared.trie"
    build_trie_from_streams([rng.integers(0, 3000, size=150_000)], path, order=3, vocab_size=3000)
    size_kb = path.stat().st_size // 1024
    assert size_kb > 2000
    # Clean file pages are the kernel's to reclaim at any moment (CI once saw Rss 4 kB between
    # the touch and the report under memory pressure): that says nothing about the mapping, so
    # the measurement is taken again, up to three times, until both readers hold the file.
    for _ in range(3):
        reports = _smaps_of_two_readers(path)
        if all(rep.get("regions") and rep["regions"][0].get("Rss", 0) >= 0.9 * size_kb for rep in reports):
            break
    for rep in reports:
        (region,) = rep["regions"]  # one read-only mapping of the whole file, no private copy
        assert region["Rss"] >= 0.9 * size_kb
        # Pages mapped by both processes (Dirty only means the fresh file is not written back yet).
        assert region["Shared_Clean"] + region["Shared_Dirty"] >= 0.9 * region["Rss"]
        assert region["Private_Clean"] + region["Private_Dirty"] <= 0.1 * region["Rss"]
        assert region.get("Anonymous", 0) == 0
        assert region["Pss"] <= 0.6 * region["Rss"]  # each process is charged about half
    assert reports[0]["regions"][0]["inode"] == reports[1]["regions"][0]["inode"] == str(os.stat(path).st_ino)
