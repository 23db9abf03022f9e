"""The app's typed state and the request-side work on it: model lookup, tokenization, limits."""
from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web

from backend.chat_template import ChatTemplateError, ChatTemplateMissing
from backend.engine.nvtx import NvtxRanges
from backend.engine.sampling import SamplingParams

from .config import ServerConfig
from .errors import APIError, bad_request
from .metrics import Metrics
from .protocol import GenerationRequest

_MAX_ID_LEN = 128
REQUEST_ID = web.RequestKey("request_id", str)


@dataclass
class BackendState:
    config: ServerConfig
    source: object  # backend.weights.loader.ModelSource
    engine: object  # backend.engine.async_engine.AsyncEngine
    metrics: Metrics
    executor: ThreadPoolExecutor  # tokenizer and chat-template work, off the event loop
    model_name: str
    nvtx: NvtxRanges  # "<prefix>:tokenize" / "<prefix>:detokenize" ranges; no-ops when off

    @property
    def tokenizer(self) -> object:
        return self.source.tokenizer

    def check_model(self, model: str | None) -> None:
        """404 for a model this server does not serve (the OpenAI shape and code)."""
        if model is None or model in (self.model_name, self.config.model):
            return
        shown = model if isinstance(model, str) and len(model) <= 256 else \
            f"{str(model)[:256]}..."
        raise APIError(404, f"The model '{shown}' does not exist; this server serves "
                       f"'{self.model_name}'", type="not_found_error", param="model",
                       code="model_not_found")

    async def tokenize(self, messages: tuple[dict, ...] | None, prompt: str | None,
                       add_generation_prompt: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._tokenize_sync, messages, prompt,
                                          add_generation_prompt)

    def _tokenize_sync(self, messages: tuple[dict, ...] | None, prompt: str | None,
                       add_generation_prompt: bool) -> list[int]:
        with self.nvtx.range("tokenize"):
            return self._tokenize_ranged(messages, prompt, add_generation_prompt)

    def _tokenize_ranged(self, messages: tuple[dict, ...] | None, prompt: str | None,
                         add_generation_prompt: bool) -> list[int]:
        tok = self.tokenizer
        if messages is not None:
            try:
                text = tok.apply_chat_template(list(messages), add_generation_prompt)
            except ChatTemplateMissing as exc:
                raise bad_request(f"model '{self.model_name}' has no chat template, so "
                                  f"/v1/chat/completions cannot format messages for it; "
                                  f"send a plain prompt to /v1/completions instead ({exc})",
                                  param="messages", code="chat_template_missing") from exc
            except ChatTemplateError as exc:  # e.g. the template's own role-order check
                raise bad_request(str(exc), param="messages",
                                  code="chat_template_error") from exc
            return tok.encode(text)
        ids = tok.encode(prompt or "")
        bos = tok.bos_token_id
        # Models whose tokenizer adds BOS (Llama) expect it at the start of a raw prompt.
        if getattr(tok, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids

    async def prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.prompt_token_ids is not None:
            vocab = self.tokenizer.vocab_size
            bad = [t for t in req.prompt_token_ids if not 0 <= t < vocab]
            if bad:
                raise bad_request(f"prompt token id {bad[0]} is outside the vocabulary "
                                  f"(size {vocab})", param="prompt")
            return list(req.prompt_token_ids)
        ids = await self.tokenize(req.messages, req.prompt)
        if not ids:
            raise bad_request("the prompt is empty", param=_prompt_param(req))
        return ids

    def sampling_params(self, req: GenerationRequest, prompt_len: int) -> SamplingParams:
        """Resolve defaults and apply the context limits; raises 400s naming both lengths."""
        max_len, param = self.engine.max_model_len, _prompt_param(req)
        if prompt_len >= max_len:
            raise bad_request(f"This model's maximum context length is {max_len} tokens, but "
                              f"the prompt has {prompt_len} tokens (no room to generate)",
                              param=param, code="context_length_exceeded")
        room = max_len - prompt_len
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = room if req.kind == "chat" else \
                min(self.config.default_completion_max_tokens, room)
        elif prompt_len + max_tokens > max_len:
            raise bad_request(f"This model's maximum context length is {max_len} tokens, but "
                              f"{prompt_len + max_tokens} were requested ({prompt_len} in the "
                              f"prompt, {max_tokens} for the completion)", param="max_tokens",
                              code="context_length_exceeded")
        if req.min_tokens > max_tokens:
            raise bad_request(f"'min_tokens' ({req.min_tokens}) exceeds max_tokens "
                              f"({max_tokens})", param="min_tokens")
        # The request schema checked every field (protocol.py) and max_tokens is within the
        # context here: constructed without a second validation.
        params = SamplingParams.model_construct(
            max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
            top_k=req.top_k, seed=req.seed, min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos, stop_token_ids=req.stop_token_ids)
        self.engine.check_request(prompt_len, params)  # RequestRejected -> 400 (middleware)
        return params


def _prompt_param(req: GenerationRequest) -> str:
    return "messages" if req.kind == "chat" else "prompt"


def request_id(request: web.Request) -> str:
    """The caller's x-request-id (if sane) or a new one; memoized on the request."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        given = request.headers.get("x-request-id", "")
        ok = 0 < len(given) <= _MAX_ID_LEN and given.isprintable()
        rid = given if ok else uuid.uuid4().hex
        request[REQUEST_ID] = rid
    return rid
