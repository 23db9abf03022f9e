"""Upstream transports: what sends a request to a provider and hands back its response.

``providers.<name>.transport`` picks one per provider:

- ``fast`` (default): the gateway's own HTTP/1.1 client (httpclient.py), the quickest on the
  time-to-first-token path; it reads no proxy settings.
- ``aiohttp``: aiohttp's client with ``trust_env``: honours ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
  ``NO_PROXY`` (and ``~/.netrc`` proxy credentials), for gateways behind a forward proxy.
  One difference: a body without length or chunking that ends in a connection reset reads as
  complete here (aiohttp does not tell the two ends apart); streams are still checked for
  their ``[DONE]`` / finish, and a cut JSON body fails to parse.

A ``fast`` provider whose URL a proxy variable applies to (and ``NO_PROXY`` does not exempt)
uses ``aiohttp`` instead, logged once per origin: a gateway behind a corporate proxy can then
reach a cloud upstream without any change to its config.

Both hand back a response with the same surface (``status``, ``headers``, ``content_type``,
``readany``, ``read``, ``release``, ``close``); connection failures and cut bodies are
:class:`~gateway.httpclient.UpstreamError`. Both resend a request at once, one time, when a
kept-alive connection that sat idle in the pool turns out to be dead before the first byte of
its response (the upstream closed it just as it was reused); a fresh connection that fails is
an error as before (upstream.py then retries with backoff).
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import urllib.request
from types import SimpleNamespace
from typing import Any, Iterable, Protocol

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from gateway.httpclient import Pool, Response, UpstreamError

log = logging.getLogger("gateway.transport")
_Origin = tuple[str, str, int]


class UpstreamResponse(Protocol):
    status: int

    @property
    def content_type(self) -> str: ...

    async def readany(self) -> bytes: ...

    async def read(self) -> bytes: ...

    def release(self) -> None: ...

    def release_after_body(self, timeout: float) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    async def request(self, url: URL, headers: Iterable[tuple[str, str]], body: bytes,
                      connect_timeout: float | None = None) -> Any: ...

    async def close(self) -> None: ...


def origin(url: URL) -> _Origin:
    return (url.scheme, url.host or "", url.port or (443 if url.scheme == "https" else 80))


def proxy_for(url: URL) -> str | None:
    """The proxy the environment names for ``url`` (as aiohttp's trust_env reads it)."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme)
    if not proxy or urllib.request.proxy_bypass(url.host or ""):
        return None
    return proxy


class AiohttpResponse:
    """aiohttp's ClientResponse behind the gateway's response surface."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: CIMultiDict[str] = CIMultiDict(resp.headers)

    # The same as the fast client's: they only use .headers and .readany.
    content_type = Response.content_type
    read = Response.read

    async def readany(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except (aiohttp.ClientError, OSError) as exc:  # cut body, reset
            raise UpstreamError(f"upstream body broke: {type(exc).__name__}") from None

    def release(self) -> None:
        self._resp.release()

    def release_after_body(self, timeout: float) -> None:
        """Done with it, though the body's end may still be arriving (the bytes after an SSE
        ``[DONE]``): aiohttp pools a connection only once its body is read, so the rest is
        read in the background for at most ``timeout`` seconds, then the connection is
        released, or dropped if the body did not end."""
        if self._resp.content.at_eof():
            self._resp.release()
            return
        self._drain = asyncio.get_running_loop().create_task(self._drain_then_release(timeout))

    async def _drain_then_release(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                while await self._resp.content.readany():
                    pass
        except (TimeoutError, aiohttp.ClientError, OSError):
            self._resp.close()
            return
        self._resp.release()

    def close(self) -> None:
        """Drop the connection if the body is not complete (aiohttp put a complete one back
        in its pool already: nothing is left for the upstream to stop)."""
        self._resp.close()


async def _on_reuse(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    if isinstance(ctx.trace_request_ctx, dict):
        ctx.trace_request_ctx["reused"] = True


class AiohttpTransport:
    """aiohttp's client with ``trust_env`` (proxies from the environment): no connection
    limit, no cookies, no decompression (the body is relayed as it comes)."""

    def __init__(self, keepalive_seconds: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.keepalive_seconds = keepalive_seconds
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on first use: it needs the running loop
            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(_on_reuse)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive_seconds,
                                               ssl=self._ssl if self._ssl is not None else True),
                cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, trust_env=True,
                timeout=aiohttp.ClientTimeout(total=None), trace_configs=[trace])
        return self._session

    async def request(self, url: URL, headers: Iterable[tuple[str, str]], body: bytes,
                      connect_timeout: float | None = None) -> AiohttpResponse:
        """POST ``body`` to ``url``; returns once the response headers are in."""
        head = list(headers)
        for name, value in head:  # no header injection (aiohttp would refuse it later)
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise UpstreamError(f"header {name!r} has a line break")
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        for attempt in (0, 1):
            ctx: dict[str, bool] = {}
            try:
                resp = await session.post(url, data=body, headers=head, timeout=timeout,
                                          allow_redirects=False, trace_request_ctx=ctx)
            except aiohttp.ConnectionTimeoutError:
                raise UpstreamError(f"connect to {url.host}:{url.port} timed out") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if attempt == 0 and ctx.get("reused"):
                    continue  # a kept-alive connection died while idle: once more, now
                raise UpstreamError(f"cannot reach {url.host}:{url.port}: "
                                    f"{type(exc).__name__}") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise UpstreamError(f"cannot reach {url.host}:{url.port}: "
                                    f"{type(exc).__name__}") from None
            return AiohttpResponse(resp)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Transports:
    """The transport per upstream origin: the provider's ``transport`` setting, or ``aiohttp``
    for a ``fast`` one that a proxy variable applies to. Decided once per origin (two
    providers on one origin share the first one's setting)."""

    def __init__(self, providers: Iterable[Any], keepalive_seconds: float = 30.0) -> None:
        """``providers``: objects with ``.root`` (base URL without /v1) and ``.config``."""
        self.fast = Pool(keepalive_seconds=keepalive_seconds)
        self.aiohttp = AiohttpTransport(keepalive_seconds=keepalive_seconds)
        self._configured: dict[_Origin, str] = {}
        for p in providers:
            self._configured.setdefault(origin(URL(p.root)), p.config.transport)
        self._chosen: dict[_Origin, Transport] = {}

    def for_url(self, url: URL) -> Transport:
        key = origin(url)
        chosen = self._chosen.get(key)
        if chosen is None:
            name = self._configured.get(key, "fast")
            if name == "fast" and proxy_for(url):
                log.info("%s://%s:%d is reached through a proxy from the environment: "
                         "using the aiohttp transport", *key)
                name = "aiohttp"
            chosen = self._chosen[key] = self.fast if name == "fast" else self.aiohttp
        return chosen

    async def request(self, url: URL, headers: Iterable[tuple[str, str]], body: bytes,
                      connect_timeout: float | None = None) -> Any:
        return await self.for_url(url).request(url, headers, body, connect_timeout)

    def counts(self) -> tuple[int, int]:
        """(open connections, those idle) of the default ``fast`` transport: a leak check's
        numbers (aiohttp's connector keeps its own, unexposed, counts)."""
        return self.fast.counts()

    async def close(self) -> None:
        await self.fast.close()
        await self.aiohttp.close()
