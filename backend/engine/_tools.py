"""Helpers shared by the engine's command-line tools (bench, gpu_check, kv_quality)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit_json(result: dict[str, Any], path: Path | None) -> None:
    """Print ``result`` as indented JSON and, when ``path`` is given, write the same text there."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")
