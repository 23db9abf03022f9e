"""The converted-weight cache: a GGUF dequantised once, then loaded in seconds.

Layout: <cache root>/converted/<stem>-<key>/ with model-NNNNN.safetensors shards (~2 GiB
each), config.json (ModelConfig),
tokenizer.json + tokenizer_meta.json (EOS/BOS ids, chat template) and a `complete` marker.
The key is the sha256 of the source's bytes plus the converter version, so a changed file or a
changed converter never reuses a stale entry, and the same file extracted again (a new clone,
a new mtime, another path) reuses the one entry instead of adding a copy. Hashing a 4 GB file
takes seconds, so the digest is remembered per (path, inode, size, mtime) under digests/.
An entry is written to a temporary directory and renamed into place, so concurrent starts
never see half an entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from backend.tokenizer import Tokenizer
from backend.weights.config import ModelConfig
from backend.weights.paths import cache_root

log = logging.getLogger(__name__)

CONVERTER_VERSION = 3
_MARKER = "complete"
SHARD_BYTES = 2 << 30


def cache_key(source: Path) -> str:
    h = hashlib.sha256(f"v{CONVERTER_VERSION}:{content_digest(source)}".encode())
    return h.hexdigest()[:20]


def content_digest(source: Path) -> str:
    """sha256 of the file's bytes, read from the memo when the file is unchanged since."""
    st = source.stat()
    stamp = f"{source.resolve()}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    memo = cache_root() / "digests" / hashlib.sha256(stamp.encode()).hexdigest()[:32]
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    with open(source, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, memo)  # atomic: a concurrent reader sees no digest or the whole one
    except OSError:
        pass  # an unwritable cache only costs hashing again next start
    return digest


def entry_dir(source: Path) -> Path:
    return cache_root() / "converted" / f"{source.stem}-{cache_key(source)}"


def lookup(source: Path) -> Path | None:
    entry = entry_dir(source)
    return entry if (entry / _MARKER).is_file() else None


def store(source: Path, config: ModelConfig, tokenizer: Tokenizer,
          tensors: Iterator[tuple[str, torch.Tensor]]) -> Path | None:
    """Write an entry, consuming `tensors` into safetensors shards of about SHARD_BYTES (so
    memory holds one shard, not the model). Returns the entry, or None when the cache is not
    writable (logged)."""
    entry = entry_dir(source)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            _write_shards(tmp, tensors, str(source))
            (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
            tokenizer.save(tmp)
            (tmp / _MARKER).write_text(str(source))
            try:
                os.replace(tmp, entry)
            except OSError:
                # Another process finished the same entry first; theirs is as good as ours.
                if not (entry / _MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        log.warning("could not write the weight cache at %s: %s", entry, exc)
        return None
    return entry


def _write_shards(directory: Path, tensors: Iterator[tuple[str, torch.Tensor]],
                  source: str) -> None:
    shard: dict[str, torch.Tensor] = {}
    size, count = 0, 0

    def flush() -> None:
        nonlocal shard, size, count
        count += 1
        save_file(shard, str(directory / f"model-{count:05d}.safetensors"),
                  metadata={"source": source})
        shard, size = {}, 0

    for name, tensor in tensors:
        shard[name] = tensor.contiguous()
        size += tensor.numel() * tensor.element_size()
        if size >= SHARD_BYTES:
            flush()
    if shard or count == 0:
        flush()


def entry_files(entry: Path) -> list[Path]:
    return sorted(entry.glob("model-*.safetensors"))


def load_entry(entry: Path) -> tuple[ModelConfig, Tokenizer]:
    config = ModelConfig.from_dict(json.loads((entry / "config.json").read_text()))
    return config, Tokenizer.load(entry)


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors one at a time (the model copies each into place, so peak memory stays low)."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
