"""Prompts of an exact token length for the target model.

Token counts come from the server's ``POST /tokenize`` (``{"prompt": text}`` or ``{"messages":
[...]}`` -> ``{"count": n}``), or from a local ``tokenizer.json`` (``--tokenizer``). With the
server, ``--prompt-tokens N`` is the length the model processes (chat template included), so
``usage.prompt_tokens`` in the responses equals N; a local tokenizer knows no template, so there
N is the message content's length.

Synthetic prompts are an instruction followed by words that are one token each for this
tokenizer (checked at start), drawn at random per request: every prompt is different, so the
backend's prefix cache cannot turn the prefill into a lookup. Real prompts (``--prompts-file``)
are cut or padded to N tokens by the same word-level search.
"""
from __future__ import annotations

import json
import random
from typing import Protocol
from urllib.parse import urlsplit

from loadtests.client import StreamingChatClient

INSTRUCTION = "Repeat the following words back in order:"
# Common English words; those that are one token (with a leading space) are kept at start.
_CANDIDATES = (
    "the of and to in is was for on are with as at be by this had not but from or have an they "
    "which one you were her all she there would their we him been has when who will more no if "
    "out so said what up its about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()


class TokenCounter(Protocol):
    def count_text(self, text: str) -> int: ...
    def count_messages(self, messages: list[dict]) -> int | None: ...


class ServerTokenCounter:
    """Counts with the server's ``POST /tokenize`` (our backend; the fake upstream)."""

    def __init__(self, url: str, model: str, api_key: str | None = None) -> None:
        parts = urlsplit(url)
        self._path = parts.path or "/tokenize"
        self._client = StreamingChatClient(f"{parts.scheme}://{parts.netloc}", api_key,
                                           timeout_s=30.0)
        self._model: str | None = model

    def _count(self, body: dict) -> int | None:
        if self._model is not None:
            status, out = self._client.post_json(self._path, {"model": self._model, **body})
            if status == 404:  # a gateway alias the backend doesn't know: its only model
                self._model = None
        if self._model is None:
            status, out = self._client.post_json(self._path, body)
        if status != 200 or not isinstance(out, dict):
            return None
        if isinstance(out.get("count"), int):
            return out["count"]
        return len(out["tokens"]) if isinstance(out.get("tokens"), list) else None

    def count_text(self, text: str) -> int:
        n = self._count({"prompt": text})
        if n is None:
            raise RuntimeError(f"POST {self._path} did not count a prompt")
        return n

    def count_messages(self, messages: list[dict]) -> int | None:
        return self._count({"messages": messages})

    def close(self) -> None:
        self._client.close()


class LocalTokenCounter:
    """Counts with a Hugging Face ``tokenizer.json`` (no chat template: content tokens only)."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer  # optional: only when --tokenizer is used
        self._tok = Tokenizer.from_file(path)

    def count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_messages(self, messages: list[dict]) -> int | None:
        return None

    def close(self) -> None:
        pass


class PromptFactory:
    """Makes request prompts; ``exact`` tells whether lengths were verified with the counter."""

    def __init__(self, counter: TokenCounter, target_tokens: int, chat: bool,
                 texts: list[str] | None = None, seed: int = 0) -> None:
        self._counter, self._target, self._chat = counter, target_tokens, chat
        self._rng = random.Random(seed)
        self.template_overhead = 0
        self.exact = True
        self._words: list[str] = []
        self._fitted: list[str] = []
        self._head = 0  # tokens of INSTRUCTION
        self._setup(texts)

    def _setup(self, texts: list[str] | None) -> None:
        base = self._counter.count_text("the")
        if self._chat and self._target:
            with_msg = self._counter.count_messages([{"role": "user", "content": "the"}])
            if with_msg is not None:  # tokens the template adds around the content
                self.template_overhead = with_msg - base
        self._words = [w for w in _CANDIDATES
                       if self._counter.count_text("the " + w) - base == 1] or ["the"]
        if texts and self._target:
            self._fitted = [self._fit(t) for t in texts]
        elif texts:
            self._fitted = list(texts)
        elif self._target:
            self._head = self._counter.count_text(INSTRUCTION)
            sample = self._synthetic()
            self.exact = self._counter.count_text(sample) == self.content_tokens

    @property
    def content_tokens(self) -> int:
        return max(1, self._target - self.template_overhead)

    def _synthetic(self) -> str:
        n = max(0, self.content_tokens - self._head)
        return INSTRUCTION + "".join(" " + self._rng.choice(self._words) for _ in range(n))

    def _fit(self, text: str) -> str:
        """Cut (binary search over words) or pad (one-token words) ``text`` to the target."""
        goal, words = self.content_tokens, text.split()
        have = self._counter.count_text(text) if text else 0
        if have > goal:
            lo, hi = 0, len(words)
            while lo < hi:  # largest word prefix that fits
                mid = (lo + hi + 1) // 2
                if self._counter.count_text(" ".join(words[:mid])) <= goal:
                    lo = mid
                else:
                    hi = mid - 1
            text = " ".join(words[:lo])
            have = self._counter.count_text(text) if text else 0
        pad = "".join(" " + self._rng.choice(self._words) for _ in range(max(0, goal - have)))
        text = (text + pad).strip()
        if self._counter.count_text(text) != goal:
            self.exact = False
        return text

    def next_prompt(self) -> str:
        if self._fitted:
            return self._rng.choice(self._fitted)
        if not self._target:
            return "Say hello."
        return self._synthetic()

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.next_prompt()}]


def load_prompts_file(path: str, limit: int = 1000) -> list[str]:
    """Texts from a JSONL file: ``{"prompt": str}``, ``{"text": str}`` or ``{"messages": [...]}``
    (the last user message is used)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            text = obj.get("prompt") or obj.get("text")
            if text is None and isinstance(obj.get("messages"), list):
                users = [m.get("content") for m in obj["messages"] if m.get("role") == "user"]
                text = users[-1] if users else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: no prompt/text/messages string")
            out.append(text)
            if len(out) >= limit:
                break
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def default_tokenize_url(host: str) -> str:
    """``http://h:p[/v1]`` -> ``http://h:p/tokenize`` (the backend serves it at the root)."""
    parts = urlsplit(host)
    return f"{parts.scheme}://{parts.netloc}/tokenize"
