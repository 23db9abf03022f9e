"""Prompts of an exact token length for the target model.

Token counts come from the server's ``POST /tokenize`` (``{"prompt": text}`` or ``{"messages":
[...]}`` -> ``{"count": n}``), or from a local ``tokenizer.json`` (``--tokenizer``). With the
server, ``--prompt-tokens N`` is the length the model processes (chat template included), so
``usage.prompt_tokens`` in the responses equals N; a local tokenizer knows no template, so there
N is the message content's length.

Synthetic prompts are an instruction followed by random words, drawn per request: every
prompt is different, so the backend's prefix cache cannot turn the prefill into a lookup.
Each word's token cost is measured at start. Where enough words are one token each (BPE
vocabularies) only those are drawn; otherwise (a byte-level tokenizer, where a word costs
one token per byte) words of any cost are drawn to fill the length, and a one-token unit
closes the gap. Real prompts (``--prompts-file``) are cut or padded to N tokens the same way.
"""
from __future__ import annotations

import json
import random
from typing import Protocol
from urllib.parse import urlsplit

from loadtests.client import StreamingChatClient

INSTRUCTION = "Repeat the following words back in order:"
# Common English words; their token costs (with a leading space) are measured at start.
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


MIN_ONE_TOKEN_WORDS = 16  # fewer: draw words of any cost (else prompts would barely vary)
_MAX_WORD_COST = 8  # tokens; dearer candidates are left out
_UNIT = "."  # appended without a space: one token in the tokenizers seen (checked at start)


class PromptFactory:
    """Makes request prompts; ``exact`` tells whether lengths were verified with the counter."""

    def __init__(self, counter: TokenCounter, target_tokens: int, chat: bool,
                 texts: list[str] | None = None, seed: int = 0) -> None:
        self._counter, self._target, self._chat = counter, target_tokens, chat
        self._rng = random.Random(seed)
        self.template_overhead = 0
        self.exact = True
        self._words: list[tuple[str, int]] = []  # (word, token cost with its leading space)
        self._unit = False  # whether _UNIT costs exactly one token
        self._fitted: list[str] = []
        self._instruction = INSTRUCTION
        self._head = 0  # tokens of the instruction
        self._setup(texts)

    def _setup(self, texts: list[str] | None) -> None:
        base = self._counter.count_text("the")
        if self._chat and self._target:
            with_msg = self._counter.count_messages([{"role": "user", "content": "the"}])
            if with_msg is not None:  # tokens the template adds around the content
                self.template_overhead = with_msg - base
        costs = [(w, self._counter.count_text("the " + w) - base) for w in _CANDIDATES]
        ones = [(w, c) for w, c in costs if c == 1]
        self._words = ones if len(ones) >= MIN_ONE_TOKEN_WORDS else \
            [(w, c) for w, c in costs if 1 <= c <= _MAX_WORD_COST]
        self._unit = self._counter.count_text("the" + _UNIT) - base == 1
        if texts and self._target:
            self._fitted = [self._fit(t) for t in texts]
        elif texts:
            self._fitted = list(texts)
        elif self._target:
            self._head = self._counter.count_text(INSTRUCTION)
            if self._head > self.content_tokens:  # no room for it: random words alone
                self._instruction, self._head = "", 0
            sample = self._synthetic()
            self.exact = self._counter.count_text(sample) == self.content_tokens

    @property
    def content_tokens(self) -> int:
        return max(1, self._target - self.template_overhead)

    def _synthetic(self) -> str:
        return self._instruction + self._filler(max(0, self.content_tokens - self._head))

    def _filler(self, n: int) -> str:
        """Random words costing ``n`` tokens in all (as measured one by one at start; the
        prompt's own count is checked once, ``exact``)."""
        out, words = [], self._words
        cheapest = min((c for _, c in words), default=n + 1)
        while n >= cheapest:
            w, c = self._rng.choice(words)
            while c > n:  # near the end: redraw among the words that still fit
                w, c = self._rng.choice([wc for wc in words if wc[1] <= n])
            out.append(" " + w)
            n -= c
        if n and self._unit:
            out.append(_UNIT * n)
        return "".join(out)

    def _fit(self, text: str) -> str:
        """Cut (binary search over words) or pad (random words) ``text`` to the target."""
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
        text = (text + self._filler(max(0, goal - have))).strip()
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
