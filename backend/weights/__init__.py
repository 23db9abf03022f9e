"""Model configs and weight loaders (HF directory, GGUF, synthetic presets, embedded model).

The public names are imported lazily so that `python -m backend.weights.embedded` (run by
`make model`) does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.weights.config import ModelConfig
    from backend.weights.loader import ModelLoadError, ModelSource, load_model_source

__all__ = ["ModelConfig", "ModelSource", "ModelLoadError", "load_model_source"]


def __getattr__(name: str) -> Any:
    if name == "ModelConfig":
        from backend.weights.config import ModelConfig
        return ModelConfig
    if name in ("ModelSource", "ModelLoadError", "load_model_source"):
        from backend.weights import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'backend.weights' has no attribute {name!r}")
