"""Opening the upstream response: failover across deployments, retries with backoff, timeouts.

Everything here happens before the first byte reaches the client, so every failure is still
retryable. Once :func:`open_upstream` returns a 200 response, the relay owns it.
"""
from __future__ import annotations

import asyncio
import json
import logging
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

log = logging.getLogger("gateway.upstream")

# Never forwarded: hop-by-hop headers (RFC 9110 7.6.1), the client's credentials, and headers
# the gateway sets itself.
_DROP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length", "authorization",
    "x-api-key", "api-key", "cookie", "accept-encoding", "expect", "content-type",
    "x-request-id", "content-encoding",  # the body is re-encoded: plain JSON
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
    """A failed attempt another attempt may fix. ``answered``: the upstream answered (5xx), so
    the request reached it; ``rate_limited``: a 429, so this deployment is done for now."""

    def __init__(self, error: GatewayError, retry_after: float | None = None, *,
                 answered: bool = False, rate_limited: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after
        self.answered = answered
        self.rate_limited = rate_limited


# The backend's answer for a request that broke an engine step: retrying it would break
# another step (and every stream sharing it), so it is never retried.
STEP_FAILED = "request_failed_in_step"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        value = float(headers.get("Retry-After", ""))
    except ValueError:
        return None
    return max(0.0, value) if value == value and value != float("inf") else None


def scrub(value: Any, secret: str | None) -> Any:
    """``value`` (decoded JSON, or text) with every occurrence of ``secret`` masked. On the
    decoded form, so a key written with JSON escapes (``\\u0073\\u006b...``) is caught too."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, "***")
    if isinstance(value, dict):
        return {scrub(k, secret): scrub(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secret) for v in value]
    return value


def _error_code(body: Any) -> Any:
    err = body.get("error") if isinstance(body, dict) else None
    return err.get("code") if isinstance(err, dict) else None


async def _classify(resp: Response, dep: Deployment) -> None:
    """Raise for a non-200 upstream answer: _Retryable, or a final GatewayError."""
    name = dep.provider.name
    try:
        raw = await resp.read()
    except UpstreamError:
        raw = b""
    resp.release()
    try:
        body: Any = scrub(json.loads(raw.decode("utf-8", "replace")), dep.provider.api_key)
    except (ValueError, RecursionError):
        body = None
    if resp.status == 429:
        raise _Retryable(RateLimited(f"Provider {name!r} is rate limiting (429)."),
                         _retry_after(resp.headers), rate_limited=True)
    if resp.status >= 500:
        if _error_code(body) == STEP_FAILED:
            raise BadGateway(f"Provider {name!r} failed this request inside a model step "
                             f"(HTTP {resp.status}); it is not retried.", code=STEP_FAILED)
        cls = Unavailable if resp.status == 503 else BadGateway
        raise _Retryable(cls(f"Provider {name!r} answered HTTP {resp.status}."), answered=True)
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
                                    f"({exc}).", code="upstream_unreachable")) from None
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
    """Try deployments (least loaded first, then again with backoff) until one answers 200.

    Retry policy (docs/GATEWAY.md): no answer (refused, reset, no headers in time) is retried
    up to ``max_retries`` times; a 5xx answer at most once per request; a 429 moves on to a
    deployment not yet rate limited in this request, never the same one; a 4xx and a
    ``request_failed_in_step`` 500 are never retried. A deployment whose 429 asked for time
    (``Retry-After``) is tried after the others until that time has passed.
    """
    usable = [d for d in order if d.provider.missing_env is None]
    now = asyncio.get_running_loop().time()
    usable.sort(key=lambda d: d.limited_until > now)  # stable: load order otherwise kept
    if not usable:
        p = order[0].provider
        raise Unavailable(f"Provider {p.name!r} has no API key: environment variable "
                          f"{p.missing_env} is not set.", code="upstream_key_missing")
    attempts = max(len(usable), 1 + usable[0].provider.config.max_retries)
    last: _Retryable | None = None
    payload, payload_model = b"", None
    tried: set[int] = set()
    limited: set[int] = set()   # deployments that answered 429 in this request
    answered = 0                # 5xx answers so far
    for n in range(attempts):
        dep = next((d for k in range(len(usable))
                    if id(d := usable[(n + k) % len(usable)]) not in limited), None)
        if dep is None:
            break  # every deployment is rate limiting us
        if id(dep) in tried:  # this deployment failed before: wait before hitting it again
            await asyncio.sleep(_backoff(retry, n - len(usable)))
        tried.add(id(dep))
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
            _log_failure(rec, dep, exc.error)
            last = exc
            if exc.rate_limited:
                limited.add(id(dep))
                if exc.retry_after:  # later requests try it last until then
                    dep.limited_until = asyncio.get_running_loop().time() + exc.retry_after
            answered += exc.answered
            if answered > 1:
                break  # a second 5xx answer: the request itself may be what fails
        except BaseException as exc:
            dep.in_flight -= 1
            if isinstance(exc, GatewayError):
                series.errors.inc()
                _log_failure(rec, dep, exc)
            raise
    assert last is not None
    err = last.error
    if isinstance(err, RateLimited) and last.retry_after is not None:
        err.headers["Retry-After"] = f"{last.retry_after:g}"
    raise err


def _log_failure(rec: RequestRecord, dep: Deployment, err: GatewayError) -> None:
    """One line per failed attempt: who, what status and code; never a body or a key."""
    log.warning("upstream attempt failed: provider=%s model=%r status=%d code=%r request=%s",
                dep.provider.name, dep.model[:128], err.status, str(err.code)[:64],
                rec.request_id)
