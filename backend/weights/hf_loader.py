"""Hugging Face directory loader: config.json, (sharded) *.safetensors, tokenizer.json,
tokenizer_config.json / chat_template.jinja, generation_config.json.

Tensors are streamed from the safetensors files as stored (no conversion, no cache needed:
safetensors loads are already fast).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from backend.tokenizer import Tokenizer, TokenizerMeta
from backend.weights.cache import iter_safetensors
from backend.weights.config import ModelConfig
from backend.weights.source import ModelLoadError, ModelSource


def load_hf_dir(directory: str | Path, name: str | None = None) -> ModelSource:
    directory = Path(directory)
    hf_config = _read_json(directory / "config.json")
    try:
        config = ModelConfig.from_hf_dict(hf_config)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{directory / 'config.json'}: {exc}") from exc
    files = safetensors_files(directory)
    tokenizer = load_hf_tokenizer(directory, hf_config)
    return ModelSource(name or directory.name, config, tokenizer,
                       lambda: iter_safetensors(files))


def safetensors_files(directory: Path) -> list[Path]:
    """The shards listed in model.safetensors.index.json, else every *.safetensors file."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"shards named in {index} are missing: {', '.join(missing)}")
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory} has no *.safetensors weights (pytorch_model.bin is "
                             "not supported; convert it with transformers' save_pretrained)")
    return files


def load_hf_tokenizer(directory: Path, hf_config: dict[str, Any] | None = None) -> Tokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{directory} has no tokenizer.json (a fast tokenizer is needed)")
    backend = HFTokenizer.from_file(str(path))
    tok_config = _read_json(directory / "tokenizer_config.json", missing_ok=True)
    gen_config = _read_json(directory / "generation_config.json", missing_ok=True)
    hf_config = hf_config or {}
    special = {k: _token_str(tok_config.get(k)) for k in
               ("bos_token", "eos_token", "unk_token", "pad_token")}

    def token_id(token: str | None) -> int | None:
        return backend.token_to_id(token) if token else None

    bos = token_id(special["bos_token"])
    if bos is None and isinstance(hf_config.get("bos_token_id"), int):
        bos = hf_config["bos_token_id"]
    eos_ids = [token_id(special["eos_token"])]
    eos_ids += _ids(hf_config.get("eos_token_id")) + _ids(gen_config.get("eos_token_id"))
    eos = tuple(dict.fromkeys(i for i in eos_ids if i is not None))
    meta = TokenizerMeta(eos_token_ids=eos, bos_token_id=bos,
                         add_bos_token=_adds_bos(backend, bos, tok_config),
                         chat_template=_chat_template(directory, tok_config),
                         special_tokens=special)
    return Tokenizer(backend, meta)


def _adds_bos(backend: HFTokenizer, bos: int | None, tok_config: dict[str, Any]) -> bool:
    """Whether raw prompts should start with BOS: the config's flag, else what the tokenizer's
    own post-processor does (Llama 3's adds <|begin_of_text|>)."""
    if "add_bos_token" in tok_config:
        return bool(tok_config["add_bos_token"])
    if bos is None:
        return False
    ids = backend.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos


def _chat_template(directory: Path, tok_config: dict[str, Any]) -> str | None:
    """chat_template.jinja (newer transformers) wins over tokenizer_config.json's field, which
    may be a string or a list of named templates ("default" is the chat one)."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised: {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _read_json(path: Path, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data
