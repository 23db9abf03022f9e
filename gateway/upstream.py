"""Opening the upstream response: failover across deployments, retries with backoff, timeouts.

Everything here happens before the first byte reaches the client, so every failure is still
retryable. Once :func:`open_upstream` returns a 200 response, the relay owns it.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config import RetryConfig
from gateway.errors import (BadGateway, GatewayError, GatewayTimeout, RateLimited, Unavailable,
                            UpstreamStatus)
from gateway.httpclient import Response, UpstreamError
from gateway.metrics import Series
from gateway.record import RequestRecord
from gateway.router import Deployment
from gateway.transport import Transport

# Never forwarded: hop-by-hop headers (RFC 9110 7.6.1), the client's credentials, and headers
# the gateway sets itself.
_DROP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length", "authorization",
    "x-api-key", "api-key", "cookie", "accept-encoding", "expect", "content-type",
    "x-request-id",
})


def forward_headers(client: CIMultiDictProxy[str], request_id: str) -> CIMultiDict[str]:
    """Client headers minus hop-by-hop (also those named in Connection) and credentials."""
    named = {h.strip().lower() for h in client.get("Connection", "").split(",") if h.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in client.items():
        low = name.lower()
        if low not in _DROP and low not in named:
            out.add(name, value)
    out["Content-Type"] = "application/json"
    out["Accept-Encoding"] = "identity"  # relayed as is: SSE must not be compressed
    out["x-request-id"] = request_id
    return out


@dataclass
class Opened:
    response: Response
    deployment: Deployment
    first_deadline: float   # loop.time() by which the first content must arrive
    total_deadline: float   # loop.time() by which the whole response must be done


class _Retryable(Exception):
    def __init__(self, error: GatewayError, retry_after: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        return max(0.0, float(headers.get("Retry-After", "")))
    except ValueError:
        return None


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


async def _classify(resp: Response, dep: Deployment) -> None:
    """Raise for a non-200 upstream answer: _Retryable, or a final GatewayError."""
    name = dep.provider.name
    try:
        raw = await resp.read()
    except UpstreamError:
        raw = b""
    resp.release()
    try:
        body: Any = json.loads(_scrub(raw.decode("utf-8", "replace"), dep.provider.api_key))
    except ValueError:
        body = None
    if resp.status == 429:
        raise _Retryable(RateLimited(f"Provider {name!r} is rate limiting (429)."),
                         _retry_after(resp.headers))
    if resp.status >= 500:
        cls = Unavailable if resp.status == 503 else BadGateway
        raise _Retryable(cls(f"Provider {name!r} answered HTTP {resp.status}."))
    if resp.status in (401, 403):
        # Our upstream credentials are wrong: not the client's fault, and not its key.
        raise BadGateway(f"Provider {name!r} rejected the gateway's credentials "
                         f"(HTTP {resp.status}); check its api_key_env.",
                         code="upstream_auth_failed")
    raise UpstreamStatus(resp.status, body, f"Provider {name!r} answered HTTP {resp.status}.")


async def _attempt(pool: Transport, dep: Deployment, endpoint: str,
                   body: bytes, headers: CIMultiDict[str], rec: RequestRecord) -> Opened:
    pc = dep.provider.config
    loop = asyncio.get_running_loop()
    start = loop.time()
    total_deadline = start + pc.timeout_seconds
    first_deadline = min(total_deadline,
                         start + (pc.first_token_timeout_seconds or pc.timeout_seconds))
    headers.popall("Authorization", None)  # never carry one provider's key to another
    if dep.provider.api_key:
        headers["Authorization"] = "Bearer " + dep.provider.api_key
    rec.t_attempt_ns = time.perf_counter_ns()
    if rec.t_sent_ns is None:
        rec.t_sent_ns = rec.t_attempt_ns
    try:
        async with asyncio.timeout_at(first_deadline):
            resp = await pool.request(dep.provider.url(endpoint), headers.items(), body,
                                      pc.connect_timeout_seconds)
    except TimeoutError:
        raise _Retryable(GatewayTimeout(f"Provider {dep.provider.name!r} sent no response "
                                        "headers in time.")) from None
    except UpstreamError as exc:  # refused, reset, closed before headers, DNS, TLS ...
        raise _Retryable(BadGateway(f"Provider {dep.provider.name!r} is unreachable "
                                    f"({exc}).", code="upstream_unreachable"))
    rec.t_headers_ns = time.perf_counter_ns()
    if resp.status != 200:
        await _classify(resp, dep)
    if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
        resp.close()  # asked for identity; a compressed body would reach the client garbled
        raise BadGateway(f"Provider {dep.provider.name!r} sent a compressed body "
                         f"({resp.headers['Content-Encoding']}).", code="upstream_bad_encoding")
    return Opened(resp, dep, first_deadline, total_deadline)


def _backoff(retry: RetryConfig, n: int) -> float:
    cap = min(retry.backoff_max_seconds, retry.backoff_base_seconds * (2 ** n))
    return cap * (0.5 + random.random() / 2)  # jitter: spread synchronized retries


async def open_upstream(pool: Transport, order: list[Deployment], endpoint: str,
                        body: dict[str, Any], headers: CIMultiDict[str], rec: RequestRecord,
                        series: Series, retry: RetryConfig) -> Opened:
    """Try deployments (least loaded first, then again with backoff) until one answers 200."""
    usable = [d for d in order if d.provider.missing_env is None]
    if not usable:
        p = order[0].provider
        raise Unavailable(f"Provider {p.name!r} has no API key: environment variable "
                          f"{p.missing_env} is not set.", code="upstream_key_missing")
    attempts = max(len(usable), 1 + usable[0].provider.config.max_retries)
    last: _Retryable | None = None
    payload, payload_model = b"", None
    for n in range(attempts):
        dep = usable[n % len(usable)]
        if n >= len(usable):  # this deployment failed before: wait before hitting it again
            delay = _backoff(retry, n - len(usable))
            if last is not None and last.retry_after is not None:
                if last.retry_after > retry.retry_after_cap_seconds:
                    break  # the upstream wants longer than we will hold the client
                delay = max(delay, last.retry_after)
            await asyncio.sleep(delay)
        if n:
            rec.retries += 1
            series.retries.inc()
        if payload_model != dep.model:
            payload = json.dumps({**body, "model": dep.model}).encode()
            payload_model = dep.model
        rec.provider, rec.upstream_model = dep.provider.name, dep.model
        dep.in_flight += 1  # the caller releases it when the request ends
        try:
            return await _attempt(pool, dep, endpoint, payload, headers, rec)
        except _Retryable as exc:
            dep.in_flight -= 1
            dep.failed(exc.error)  # outlier ejection (routing.py)
            series.errors.inc()
            last = exc
        except BaseException as exc:
            dep.in_flight -= 1
            if isinstance(exc, GatewayError):
                series.errors.inc()
            raise
    assert last is not None
    err = last.error
    if isinstance(err, RateLimited) and last.retry_after is not None:
        err.headers["Retry-After"] = f"{last.retry_after:g}"
    raise err
