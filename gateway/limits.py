"""Per-key limits: requests and tokens per window, and requests in flight.

``keys[].rpm`` counts admitted requests, ``keys[].tpm`` prompt + completion tokens (from usage,
charged when a request ends), both in fixed windows of ``limits.window_seconds`` (default 60)
aligned to unix time; ``keys[].max_concurrent`` bounds requests in flight. A request over a
limit gets 429 ``rate_limit_exceeded`` with ``Retry-After`` (seconds to the window's end, or 1
for concurrency) and is counted in ``gateway_rate_limited_total{key,reason}``.

The counters live in this process by default. With ``limits.store: redis://...`` they live in
Redis, so every worker and replica shares them: one Lua script checks and counts atomically
(an admitted count is exact). If Redis fails, the request is decided by this process's own
counters instead (logged once per outage, counted in ``gateway_limits_store_errors_total``),
and Redis is tried again after ``STORE_RETRY_SECONDS``.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.config import GatewayConfig, KeyConfig
from gateway.errors import GatewayError
from gateway.metrics import Metrics

log = logging.getLogger("gateway.limits")
STORE_RETRY_SECONDS = 1.0   # after a Redis failure, local counters decide for this long
STORE_TIMEOUT_SECONDS = 0.5  # a Redis call slower than this counts as a failure

# KEYS: request counter, token counter (both of this window), in-flight sorted set.
# ARGV: rpm, tpm, max_concurrent (0 = no limit), window ms, now ms, member, stale-before ms,
#       lease ms. Checks tokens and concurrency before counting the request, so a request
#       refused for those does not use up the rpm budget.
_ADMIT = """
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') >= tpm then return 'tpm' end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[7])
  if redis.call('ZCARD', KEYS[3]) >= maxc then return 'max_concurrent' end
end
if rpm > 0 then
  local n = redis.call('INCR', KEYS[1])
  if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
  if n > rpm then return 'rpm' end
end
if maxc > 0 then
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
end
return 'ok'
"""
# KEYS: token counter of the current window, in-flight set. ARGV: tokens, window ms, member.
_RELEASE = """
if tonumber(ARGV[1]) > 0 then
  if redis.call('INCRBY', KEYS[1], ARGV[1]) == tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""


class KeyRateLimited(GatewayError):
    """A client key went over one of its own limits (not the upstream's 429)."""

    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"


@dataclass
class Ticket:
    """One admitted request of a limited key; :meth:`Limiter.release` ends it."""
    key: str
    member: str            # its entry in the shared in-flight set
    shared: bool           # admitted by the Redis store (else by local counters)


@dataclass
class _Window:
    index: int = -1
    requests: int = 0
    tokens: int = 0


class LocalCounters:
    """This process's counters: fixed windows and in-flight counts per key name."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}
        self.in_flight: dict[str, int] = {}

    def _window(self, name: str, now: float) -> _Window:
        index = int(now // self.window_s)
        w = self._windows.get(name)
        if w is None or w.index != index:
            w = self._windows[name] = _Window(index)
        return w

    def admit(self, name: str, k: KeyConfig, now: float) -> str:
        """'ok' (and counted), or the name of the limit that refuses."""
        w = self._window(name, now)
        if k.tpm and w.tokens >= k.tpm:
            return "tpm"
        if k.max_concurrent and self.in_flight.get(name, 0) >= k.max_concurrent:
            return "max_concurrent"
        if k.rpm and w.requests >= k.rpm:
            return "rpm"
        self.count(name, now)
        return "ok"

    def count(self, name: str, now: float) -> None:
        """Note an admission (also those the shared store made: the fallback's view)."""
        self._window(name, now).requests += 1
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def release(self, name: str, tokens: int, now: float) -> None:
        self._window(name, now).tokens += tokens
        self.in_flight[name] = max(0, self.in_flight.get(name, 0) - 1)


class RedisCounters:
    """The shared store: one Lua call per admission and one per release."""

    def __init__(self, url: str, window_s: float, lease_s: float) -> None:
        self.client = aioredis.Redis.from_url(url, socket_timeout=STORE_TIMEOUT_SECONDS,
                                              socket_connect_timeout=STORE_TIMEOUT_SECONDS)
        self._admit = self.client.register_script(_ADMIT)
        self._release = self.client.register_script(_RELEASE)
        self.window_ms = int(window_s * 1000)
        self.lease_ms = int(lease_s * 1000)

    def _keys(self, name: str, now: float) -> tuple[str, str, str]:
        index = int(now * 1000) // self.window_ms
        return (f"firsttoken:rl:{name}:{index}:req", f"firsttoken:rl:{name}:{index}:tok",
                f"firsttoken:rl:{name}:inflight")

    async def admit(self, name: str, k: KeyConfig, member: str, now: float) -> str:
        now_ms = int(now * 1000)
        reason = await self._admit(keys=self._keys(name, now), args=[
            k.rpm or 0, k.tpm or 0, k.max_concurrent or 0, self.window_ms, now_ms, member,
            now_ms - self.lease_ms, self.lease_ms])
        return reason.decode() if isinstance(reason, bytes) else str(reason)

    async def release(self, name: str, member: str, tokens: int, now: float) -> None:
        req, tok, inflight = self._keys(name, now)
        await self._release(keys=[tok, inflight], args=[tokens, self.window_ms, member])

    async def close(self) -> None:
        await self.client.aclose()


class Limiter:
    """Admits or refuses requests of keys that have limits; keys without any pass untouched."""

    def __init__(self, config: GatewayConfig, metrics: Metrics) -> None:
        self.limits: dict[str, KeyConfig] = {
            k.name: k for k in config.keys if k.rpm or k.tpm or k.max_concurrent}
        self.window_s = config.limits.window_seconds
        self.local = LocalCounters(self.window_s)
        # A stale in-flight entry (its worker died) expires after the longest a request can
        # take: every attempt's total timeout, plus a minute.
        lease = max((p.timeout_seconds * (p.max_retries + 1)
                     for p in config.providers.values()), default=0.0) + 60.0
        self.store = (RedisCounters(config.limits.store, self.window_s, lease)
                      if config.limits.store else None)
        self._store_down_until = 0.0
        self._releasing: set[asyncio.Task] = set()
        self.refused = metrics.rate_limited
        self.store_errors = metrics.limits_store_errors

    def limited(self, name: str) -> bool:
        return name in self.limits

    async def admit(self, name: str) -> Ticket | None:
        """None for a key without limits; a Ticket to release; KeyRateLimited when over."""
        k = self.limits.get(name)
        if k is None:
            return None
        now = time.time()
        member = uuid.uuid4().hex
        reason: str | None = None
        if self.store is not None and time.monotonic() >= self._store_down_until:
            try:
                reason = await self.store.admit(name, k, member, now)
            except (RedisError, OSError, TimeoutError) as exc:
                self._store_failed(exc)
            else:
                if self._store_down_until:
                    log.warning("limits store is back: key limits are shared again")
                    self._store_down_until = 0.0
        shared = reason is not None
        if reason is None:
            reason = self.local.admit(name, k, now)
        elif reason == "ok":
            self.local.count(name, now)
        if reason != "ok":
            self.refused.labels(name, reason).inc()
            raise self._refusal(name, reason, now)
        return Ticket(name, member, shared)

    def release(self, ticket: Ticket, tokens: int) -> None:
        """The request ended having used ``tokens`` (prompt + completion); the shared store
        is told in a task of its own, so a slow Redis never holds the request's end."""
        now = time.time()
        self.local.release(ticket.key, tokens, now)
        if ticket.shared and self.store is not None:
            task = asyncio.get_running_loop().create_task(
                self._release_shared(self.store, ticket, tokens, now))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _release_shared(self, store: RedisCounters, ticket: Ticket, tokens: int,
                              now: float) -> None:
        try:
            await store.release(ticket.key, ticket.member, tokens, now)
        except (RedisError, OSError, TimeoutError) as exc:
            # The in-flight entry expires with its lease; the tokens are not counted.
            self._store_failed(exc)


    def _store_failed(self, exc: BaseException) -> None:
        self.store_errors.inc()
        if not self._store_down_until:
            log.warning("limits store unreachable (%s): key limits are enforced per "
                        "process until it is back", type(exc).__name__)
        self._store_down_until = time.monotonic() + STORE_RETRY_SECONDS

    def _refusal(self, name: str, reason: str, now: float) -> KeyRateLimited:
        if reason == "max_concurrent":
            retry, what = 1, f"{self.limits[name].max_concurrent} requests in flight"
        else:
            retry = max(1, math.ceil(self.window_s - now % self.window_s))
            limit = getattr(self.limits[name], reason)
            what = (f"{limit} requests" if reason == "rpm" else f"{limit} tokens") + \
                f" per {self.window_s:g} s"
        return KeyRateLimited(f"Key {name!r} is over its limit of {what}; retry after "
                              f"{retry} s.", code="rate_limit_exceeded",
                              headers={"Retry-After": str(retry)})

    async def close(self) -> None:
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        if self.store is not None:
            await self.store.close()
