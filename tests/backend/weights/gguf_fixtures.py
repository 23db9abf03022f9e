"""Write small Llama GGUF files the way llama.cpp's convert_hf_to_gguf.py does, for tests."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from backend.tokenizer import byte_alphabet

SHAPE = dict(hidden=64, heads=4, kv_heads=2, inter=128, layers=2, ctx=512)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permute() for Q/K rows (the inverse of what the loader must undo)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def random_hf_tensors(seed: int = 0, tied: bool = False, bias: bool = False,
                      shape: dict[str, int] = SHAPE) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, hd = shape["hidden"], shape["hidden"] // shape["heads"]
    vocab = len(tokens())

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.5

    t = {"model.embed_tokens.weight": r(vocab, h), "model.norm.weight": 1 + r(h) * 0.1}
    if not tied:
        t["lm_head.weight"] = r(vocab, h)
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": 1 + r(h) * 0.1,
            p + "post_attention_layernorm.weight": 1 + r(h) * 0.1,
            p + "self_attn.q_proj.weight": r(shape["heads"] * hd, h),
            p + "self_attn.k_proj.weight": r(shape["kv_heads"] * hd, h),
            p + "self_attn.v_proj.weight": r(shape["kv_heads"] * hd, h),
            p + "self_attn.o_proj.weight": r(h, shape["heads"] * hd),
            p + "mlp.gate_proj.weight": r(shape["inter"], h),
            p + "mlp.up_proj.weight": r(shape["inter"], h),
            p + "mlp.down_proj.weight": r(h, shape["inter"]),
        })
        if bias:  # Qwen2's q/k/v biases
            t.update({p + "self_attn.q_proj.bias": r(shape["heads"] * hd),
                      p + "self_attn.k_proj.bias": r(shape["kv_heads"] * hd),
                      p + "self_attn.v_proj.bias": r(shape["kv_heads"] * hd)})
    return t


def tokens() -> list[str]:
    # 3 specials + the 256 byte tokens + padding to a multiple of 32 rows.
    alphabet = byte_alphabet()
    toks = SPECIALS + [alphabet[b] for b in range(256)]
    return toks + [f"<unused{i}>" for i in range(288 - len(toks))]


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, layer, *mod, kind = hf.split(".")
    return f"blk.{layer}.{_GGUF_NAMES['.'.join(mod)]}.{kind}"


# K-quants: gguf's numpy code cannot quantise them, so tests write random blocks with sane
# fp16 scales at these byte offsets (from ggml's block layouts) and compare two dequantisers.
K_QUANT_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
                  Q.Q6_K: (208,)}
K_SHAPE = dict(hidden=256, heads=4, kv_heads=2, inter=512, layers=1, ctx=512)


def random_kquant(shape: tuple[int, int], qtype: Q, seed: int = 0) -> np.ndarray:
    rows, cols = shape
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for offset in K_QUANT_SCALES[qtype]:
        raw[:, :, offset:offset + 2] = scale
    return raw.reshape(rows, cols // block * size)


def write_llama_gguf(path: Path, tensors: dict[str, np.ndarray], qtype: Q,
                     arch: str = "llama", rope_freqs: np.ndarray | None = None,
                     original_ctx: int | None = None, shape: dict[str, int] = SHAPE,
                     head_qtype: Q | None = None) -> Path:
    """2-D weights stored as `qtype` (the embedding and output projection as `head_qtype`
    where given, as llama.cpp's Q4 files keep them in Q8_0), norms and biases as F32 (llama.cpp
    does the same). Only the llama arch permutes Q/K rows (qwen2 uses NeoX-style RoPE, stored
    as is)."""
    w = gguf.GGUFWriter(str(path), arch)
    layers_qtype = qtype
    w.add_block_count(shape["layers"])
    w.add_context_length(shape["ctx"])
    w.add_embedding_length(shape["hidden"])
    w.add_feed_forward_length(shape["inter"])
    w.add_head_count(shape["heads"])
    w.add_head_count_kv(shape["kv_heads"])
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape["hidden"] // shape["heads"])
    w.add_vocab_size(len(tokens()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens()) - len(SPECIALS)))
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    if original_ctx is not None:
        w.add_rope_scaling_orig_ctx_len(original_ctx)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for hf, array in tensors.items():
        if arch != "llama":
            pass
        elif hf.endswith(("q_proj.weight", "q_proj.bias")):
            array = permute(array, shape["heads"])
        elif hf.endswith(("k_proj.weight", "k_proj.bias")):
            array = permute(array, shape["kv_heads"])
        qtype = head_qtype if head_qtype is not None and hf.endswith(
            ("embed_tokens.weight", "lm_head.weight")) else layers_qtype
        if array.ndim == 1 or qtype == Q.F32:
            w.add_tensor(gguf_name(hf), array.astype(np.float32))
        elif qtype in K_QUANT_SCALES:
            w.add_tensor(gguf_name(hf), random_kquant(array.shape, qtype), raw_dtype=qtype)
        elif qtype == Q.F16:
            w.add_tensor(gguf_name(hf), array.astype(np.float16))
        else:
            w.add_tensor(gguf_name(hf), quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SP_CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello there!",
             "def add(a, b):\n    return a + b", "Paris is the capital of France."] * 30


def _finish_tokenizer_file(w: "gguf.GGUFWriter", path, n_vocab: int):
    """Adds the (zero) embedding the loader expects and writes the file."""
    w.add_tensor("token_embd.weight", np.zeros((n_vocab, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tiny_llama_writer(path, tokenizer_model: str) -> "gguf.GGUFWriter":
    """A writer with the hyper-parameters of the one-layer llama the tokenizer fixtures share."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(tokenizer_model)
    return w

def write_sentencepiece_gguf(path: Path) -> Path:
    """A GGUF with a SentencePiece-style ("llama") vocabulary: <unk>, <s>, </s>, 256 byte
    tokens, then BPE pieces learned from a tiny corpus, scored by merge rank like Llama 2's."""
    from tokenizers.implementations import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer(add_prefix_space=True)
    sp.train_from_iterator(SP_CORPUS, vocab_size=200, min_frequency=2, show_progress=False)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types, scores = [2, 3, 3] + [6] * 256, [0.0] * len(toks)
    for rank, (tok, _) in enumerate(sorted(sp.get_vocab().items(), key=lambda kv: kv[1])):
        if tok not in toks:
            toks.append(tok)
            types.append(1)
            scores.append(-float(rank))
    w = _tiny_llama_writer(path, "llama")
    w.add_head_count_kv(2)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    return _finish_tokenizer_file(w, path, len(toks))


def llama_cpp_rope_factors(theta: float, dim: int, factor: float, low: float, high: float,
                           old_ctx: int) -> np.ndarray:
    """convert_hf_to_gguf.py's llama3 rope_freqs loop, written out the way it does it."""
    import math

    factors = []
    for i in range(0, dim, 2):
        freq = 1.0 / (theta ** (i / dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            factors.append(1.0)
        elif wavelen > old_ctx / low:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_bpe_gguf(path: Path, pre: str) -> Path:
    """A GGUF with a byte-level BPE ("gpt2") vocabulary trained on SP_CORPUS plus digits,
    with the given `tokenizer.ggml.pre`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SP_CORPUS + ["1234567890 2024 31415 12 123"] * 30, trainer)
    model = json.loads(tok.to_str())["model"]
    toks = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = _tiny_llama_writer(path, "gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types([3, 3] + [1] * (len(toks) - 2))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    return _finish_tokenizer_file(w, path, len(toks))
