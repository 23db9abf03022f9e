"""Build a `tokenizers` tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.

A GGUF has no tokenizer.json; it stores the vocabulary, merges, token types and special ids
under llama.cpp's key names. Two models are supported:
  gpt2   byte-level BPE (SmolLM2, Llama 3, Qwen2, ...); the split regex follows
         `tokenizer.ggml.pre` like llama.cpp does.
  llama  SentencePiece BPE with byte fallback (Llama 2, Mistral); merges are rebuilt from
         the token scores, as SentencePiece itself ranks them.
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from backend.tokenizer import Tokenizer, TokenizerMeta, byte_alphabet

log = logging.getLogger(__name__)

# llama.cpp token types (gguf.TokenType)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Mistral Nemo's "tekken" (a llama-arch model).
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (split regexes applied in order). Unknown values fall back to GPT-2's.
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,), "gpt2": (_GPT2_SPLIT,),
    # SmolLM/StarCoder: every digit is its own pre-token, then GPT-2's regex.
    "smollm": (r"\p{N}", _GPT2_SPLIT), "starcoder": (r"\p{N}", _GPT2_SPLIT),
    "llama3": (_LLAMA3_SPLIT,), "llama-v3": (_LLAMA3_SPLIT,), "llama-bpe": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,), "falcon3": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,), "deepseek-r1-qwen": (_QWEN2_SPLIT,), "tekken": (_TEKKEN_SPLIT,),
}


def tokenizer_from_gguf(fields: dict[str, Any]) -> Tokenizer:
    """`fields`: GGUF metadata as plain Python values (key -> value)."""
    model = fields.get("tokenizer.ggml.model")
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(f"GGUF tokenizer: {len(tokens)} tokens but {len(types)} token types")
    if model == "gpt2":
        backend = _byte_level_bpe(tokens, list(fields.get("tokenizer.ggml.merges") or []),
                                  str(fields.get("tokenizer.ggml.pre", "default")))
        default_add_bos = False
    elif model == "llama":
        scores = list(fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        if len(scores) != len(tokens):
            raise ValueError(f"GGUF tokenizer: {len(tokens)} tokens but {len(scores)} scores")
        backend = _sentencepiece_bpe(tokens, scores, types,
                                     bool(fields.get("tokenizer.ggml.add_space_prefix", True)))
        default_add_bos = True  # llama.cpp's default for SentencePiece vocabularies
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {model!r} (supported: gpt2, llama)")
    _add_special_tokens(backend, tokens, types)
    return Tokenizer(backend, _meta(fields, tokens, default_add_bos))


def _meta(fields: dict[str, Any], tokens: list[str], default_add_bos: bool) -> TokenizerMeta:
    def token_id(key: str) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

    bos, eos = token_id("bos_token_id"), token_id("eos_token_id")
    # End-of-turn/message tokens also end generation (Llama 3's <|eot_id|>, <|eom_id|>).
    eos_ids = [i for i in (eos, token_id("eot_token_id"), token_id("eom_token_id"))
               if i is not None]
    special = {name: tokens[i] if i is not None else None for name, i in (
        ("bos_token", bos), ("eos_token", eos), ("unk_token", token_id("unknown_token_id")),
        ("pad_token", token_id("padding_token_id")))}
    return TokenizerMeta(
        eos_token_ids=tuple(dict.fromkeys(eos_ids)), bos_token_id=bos,
        add_bos_token=bool(fields.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        chat_template=fields.get("tokenizer.chat_template"), special_tokens=special)


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> HFTokenizer:
    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    # Tokens are stored in the byte alphabet; a few user-defined ones are stored as raw text.
    vocab = {}
    for index, token in enumerate(tokens):
        if not set(token) <= spelled:
            token = "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    splits = _PRE_SPLITS.get(pre)
    if splits is None:
        log.warning("GGUF tokenizer.ggml.pre=%r is not known here; splitting text like GPT-2, "
                    "which may tokenize some text differently from llama.cpp", pre)
        splits = (_GPT2_SPLIT,)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(tokens: list[str], scores: list[float], types: list[int],
                       add_space_prefix: bool) -> HFTokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    unk = next((t for t, ty in zip(tokens, types, strict=True) if ty == _UNKNOWN), None)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=_merges_from_scores(tokens, scores, types),
                                     unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", "\u2581")]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(dec)
    return backend


def _merges_from_scores(tokens: list[str], scores: list[float],
                        types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece BPE applies the merge whose result has the best score; rebuild that order
    as a merge list: every split of a normal token into two vocabulary pieces, ranked by the
    merged token's score, then by the pieces' ids (what transformers' converter does)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    candidates = []
    for token, score, ty in zip(tokens, scores, types, strict=True):
        if ty not in (_NORMAL, _USER_DEFINED) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                candidates.append((-score, vocab[left], vocab[right], left, right))
    candidates.sort()
    return [(left, right) for _, _, _, left, right in candidates]


def _add_special_tokens(backend: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens (<|im_end|>) become special added tokens and user-defined ones plain added
    tokens, so both are matched whole in text instead of being cut into pieces."""
    # Only tokens the model vocabulary holds under that spelling: adding any other would give
    # it a new id past the vocabulary the model was trained with.
    known = backend.get_vocab(with_added_tokens=False)
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL and t in known]
    users = [AddedToken(t, special=False, normalized=False)
             for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED and t in known]
    if specials:
        backend.add_special_tokens(specials)
    if users:
        backend.add_tokens(users)
