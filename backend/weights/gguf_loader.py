"""GGUF loader: dequantise with the `gguf` package, rename to HF names, undo llama.cpp's Q/K
row permutation, read config and tokenizer from the metadata; cache the result.

Tensor types: anything `gguf.quants.dequantize` handles (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, the K-quants, ...); F32/F16/BF16 keep their dtype, quantised ones become float32
(float16 for models over FLOAT32_MAX_PARAMS).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from tqdm.auto import tqdm

from backend.layers.quantize import GroupQuantized
from backend.tokenizer import Tokenizer
from backend.weights import cache
from backend.weights.config import ModelConfig
from backend.weights.gguf_quant import CODE_TYPES, gguf_codes, native_format
from backend.weights.gguf_tokenizer import tokenizer_from_gguf
from backend.weights.source import ModelLoadError, ModelSource, WeightIterator

log = logging.getLogger(__name__)

SUPPORTED_ARCHS = ("llama", "qwen2")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Not model parameters: llama.cpp's precomputed RoPE frequency factors (Llama 3.1+).
_SKIPPED = {"rope_freqs.weight"}
# Quantised tensors of models up to this size dequantise to float32 (exact); larger ones to
# float16 (half the memory: a 7B model is 14 GB instead of 28 GB; Q4/Q8 values lose ~1e-3
# relative precision).
FLOAT32_MAX_PARAMS = 2_000_000_000
_KEPT_DTYPES = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
                GGMLQuantizationType.BF16: torch.bfloat16}


def load_gguf(path: str | Path, name: str | None = None, use_cache: bool = True) -> ModelSource:
    """A ModelSource for a GGUF file, converting it (with a progress bar) on first use."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    name = name or path.stem
    quantization, head, packed = _packed_source(path)
    entry = cache.lookup(path) if use_cache else None
    if entry is None:
        config, tokenizer, tensors = convert_gguf(path)
        entry = cache.store(path, config, tokenizer, tensors()) if use_cache else None
        if entry is None:  # no (writable) cache: dequantise while the model loads, every start
            return ModelSource(name, config, tokenizer, tensors, packed, quantization, head)
    config, tokenizer = cache.load_entry(entry)
    files = cache.entry_files(entry)
    return ModelSource(name, config, tokenizer, lambda: cache.iter_safetensors(files), packed,
                       quantization, head)


def _packed_source(path: Path) -> tuple[str | None, str | None, WeightIterator]:
    """The file's native code form for the linear layers and for the output projection
    (``output.weight``, else the tied ``token_embd.weight``), and a stream of its codes, read
    from the file (already open: parsing a GGUF's metadata costs seconds) on every load."""
    reader = _open(path)
    is_linear = lambda n: n.startswith("blk.") and n.endswith(".weight") and (  # noqa: E731
        ".attn_" in n or ".ffn_" in n) and "norm" not in n
    quantization = native_format(reader.tensors, is_linear)
    by_name = {t.name: t for t in reader.tensors}
    head = by_name.get("output.weight", by_name.get("token_embd.weight"))
    head_quantization = None if head is None else CODE_TYPES.get(head.tensor_type)
    return (quantization, head_quantization,
            lambda: _convert(path, reader, read_metadata(reader), True)[1]())


def _open(path: Path) -> GGUFReader:
    try:
        return GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every metadata field as a plain Python value."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception as exc:  # one odd field must not block the rest
            log.debug("skipping GGUF field %s: %s", key, exc)
    return out


def convert_gguf(path: Path, keep_codes: bool = False
                 ) -> tuple[ModelConfig, Tokenizer, WeightIterator]:
    """Config and tokenizer now; the tensors as a re-startable stream (one tensor in memory
    at a time, with a progress bar), so even a 7B file converts in little memory.
    ``keep_codes``: Q8_0/Q4_0/Q4_1/Q4_K tensors come as their codes (GroupQuantized), not
    floats."""
    reader = _open(path)
    meta = read_metadata(reader)
    config, tensors = _convert(path, reader, meta, keep_codes)
    return config, tokenizer_from_gguf(meta), tensors


def _convert(path: Path, reader: GGUFReader, meta: dict[str, Any], keep_codes: bool
             ) -> tuple[ModelConfig, WeightIterator]:
    tensor_names = {t.name for t in reader.tensors}
    rope_freqs = next((_dequantize(t) for t in reader.tensors if t.name == "rope_freqs.weight"),
                      None)
    config = config_from_gguf(meta, tensor_names, rope_freqs)
    # Map every name and probe every type now, so a file we cannot read fails the load with a
    # clear message, not the model's init halfway through the tensors.
    named = [(t, hf_tensor_name(t.name)) for t in reader.tensors if t.name not in _SKIPPED]
    _check_types(reader.tensors)
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    quant_dtype = torch.float32 if n_params <= FLOAT32_MAX_PARAMS else torch.float16
    if quant_dtype != torch.float32 and config.torch_dtype == "float32":
        config = config.model_copy(update={"torch_dtype": "float16"})
    permute = meta["general.architecture"] == "llama"
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        desc = f"{'reading' if keep_codes else 'converting'} {path.name}"
        for t, hf_name in tqdm(named, desc=desc, unit="tensor"):
            proj = hf_name.rsplit(".", 2)[-2]
            unpermute = permute and proj in heads
            if keep_codes and t.tensor_type in CODE_TYPES and len(t.shape) == 2:
                codes = gguf_codes(t.data, t.tensor_type)
                if unpermute:  # the same row order fix, on codes and their scales
                    codes = GroupQuantized(*(unpermute_qk(x, heads[proj]) for x in
                                             (codes.codes, codes.scale, codes.min)),
                                           codes.group_size, codes.bits)
                yield hf_name, codes
                continue
            array = _dequantize(t)
            if unpermute:
                array = unpermute_qk(array, heads[proj])
            yield hf_name, _to_torch(array, _KEPT_DTYPES.get(t.tensor_type, quant_dtype))

    return config, tensors


def _check_types(tensors: list[Any]) -> None:
    probes = {t.tensor_type: t for t in tensors if t.tensor_type not in _KEPT_DTYPES}
    for qtype, t in probes.items():
        try:
            dequantize(np.asarray(t.data).reshape(-1, t.data.shape[-1])[:1], qtype)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise ModelLoadError(f"{t.name}: GGUF tensor type {qtype.name} cannot be "
                                 f"dequantised by the gguf package ({exc})") from exc


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise ModelLoadError(f"unexpected GGUF tensor {gguf_name!r} for a Llama-family model")


def unpermute_qk(weight: Any, n_head: int) -> Any:
    """Undo convert_hf_to_gguf.py's permute(): llama.cpp interleaves the two rotary halves of
    each head's rows; HF keeps them as [first half; second half]. ``weight``: a numpy array
    or a torch tensor whose first dimension is the rows."""
    dim = weight.shape[0] // n_head // 2
    return (weight.reshape(n_head, dim, 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def _dequantize(t: Any) -> np.ndarray:
    """The tensor in HF layout ([out_features, in_features]) as a numpy array."""
    if t.tensor_type == GGMLQuantizationType.F32:
        array = np.asarray(t.data, dtype=np.float32)
    elif t.tensor_type == GGMLQuantizationType.F16:
        array = np.asarray(t.data, dtype=np.float16)
    else:  # quantised, and BF16 (numpy has no bfloat16; float32 holds it exactly)
        try:
            array = dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise ModelLoadError(f"tensor {t.name}: GGUF type {t.tensor_type.name} is not "
                                 f"supported by the gguf package") from exc
    # GGUF shapes list the fastest dimension first; HF's is the reverse.
    shape = tuple(int(d) for d in reversed(t.shape))
    return array.reshape(shape)


def _to_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    # The reader memory-maps the file read-only; own the memory (copies only when needed).
    return torch.from_numpy(np.require(array, requirements=["C", "W", "O"])).to(dtype)


def config_from_gguf(meta: dict[str, Any], tensor_names: set[str],
                     rope_freqs: np.ndarray | None = None) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; "
                             f"supported: {', '.join(SUPPORTED_ARCHS)}")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    theta = float(key("rope.freq_base", 10000.0))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif rope_freqs is not None:
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        scaling = llama3_rope_from_factors(rope_freqs, theta, head_dim, orig)
        if scaling is None:
            log.warning("this GGUF's rope_freqs factors match no llama3 RoPE scaling we know; "
                        "using plain RoPE (long positions may degrade)")
    return ModelConfig(
        vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim, rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        torch_dtype=_stored_dtype(meta))


def llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float,
                   original: int) -> np.ndarray:
    """The per-frequency divisors llama3 RoPE scaling applies (what llama.cpp stores)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid))


def llama3_rope_from_factors(factors: np.ndarray, theta: float, head_dim: int,
                             original: int | None) -> dict | None:
    """Recover HF's llama3 `rope_scaling` from llama.cpp's rope_freqs tensor: the factor is the
    largest divisor; the other parameters are Meta's published ones (Llama 3.1-3.3 all use
    low=1, high=4, original context 8192), accepted only if they reproduce every factor."""
    factors = np.asarray(factors, dtype=np.float64).reshape(-1)
    if factors.shape[0] != head_dim // 2:
        return None
    factor = float(np.round(factors.max(), 4))
    for low, high, orig in ((1.0, 4.0, original or 8192), (1.0, 4.0, 8192)):
        expected = llama3_factors(theta, head_dim, factor, low, high, int(orig))
        if np.allclose(expected, factors, rtol=1e-4, atol=1e-5):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": int(orig)}
    return None


def _stored_dtype(meta: dict[str, Any]) -> str:
    # general.file_type: 0 = all F32, 1 = mostly F16, 32 = mostly BF16; quantised types are
    # dequantised to float32.
    return {1: "float16", 32: "bfloat16"}.get(int(meta.get("general.file_type", 0)), "float32")
