"""The OpenAI streaming grammar, in one place: SSE framing and the rules that time a stream.

Everything that reads an OpenAI-compatible stream — the gateway's relay, the Locust client,
the sweep, the benchmarks and the tests — frames events with :class:`SSEFramer` and decides
what counts with :func:`has_content`, :func:`is_done` and :func:`usage_of`, so every part of
firsttoken stops the TTFT clock on the same event. Standard library only: the gateway
installs without torch or Locust.
"""
from openai_stream.rules import (CONTENT_DELTA_FIELDS, choice_has_content, finish_reason_of,
                                 has_content, is_done, usage_of)
from openai_stream.sse import SSEError, SSEFramer, iter_payloads

__all__ = ["CONTENT_DELTA_FIELDS", "SSEError", "SSEFramer", "choice_has_content",
           "finish_reason_of", "has_content", "is_done", "iter_payloads", "usage_of"]
