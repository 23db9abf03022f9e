"""Where firsttoken keeps downloaded and converted weights (no imports of the loaders)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$FIRSTTOKEN_CACHE, else ~/.cache/firsttoken."""
    env = os.environ.get("FIRSTTOKEN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "firsttoken"
