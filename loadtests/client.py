"""A streaming OpenAI client on geventhttpclient that reads each SSE line as it arrives.

Why not ``FastHttpUser.client.request(stream=True)``: its ``iter_content(chunk_size)`` calls
``read(chunk_size)``, which blocks until ``chunk_size`` bytes have arrived, so a 150-byte first
chunk waits for the next few and TTFT comes out late by several ITLs. ``requests`` buffers too.
We use the same library FastHttpUser is built on (geventhttpclient, cooperative under gevent) and
its ``readline``, which returns a line as soon as one ``recv`` completes it.

The same function serves Locust (``chat.py``) and ``bench_ttft`` (one streaming code path).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from geventhttpclient import HTTPClient

from loadtests.sse import RequestRecord, StreamMeasurement
from openai_stream import SSEFramer

# The error body of a failed request is read up to this size, for the message in the record.
_MAX_ERROR_BODY = 4096


def new_request_id() -> str:
    return uuid.uuid4().hex


class StreamingChatClient:
    """One keep-alive connection to ``base_url`` (e.g. ``http://127.0.0.1:8080`` or ``.../v1``)."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout_s: float = 600.0, connect_timeout_s: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.prefix = parts.path.rstrip("/")
        if self.prefix.endswith("/v1"):  # both URL forms work, like the gateway's base_url
            self.prefix = self.prefix[: -len("/v1")]
        self.base_url = base_url
        self._http = HTTPClient(parts.hostname, port=parts.port, ssl=parts.scheme == "https",
                                concurrency=1, connection_timeout=connect_timeout_s,
                                network_timeout=timeout_s)
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self._http.close()

    def post_json(self, path: str, body: dict) -> tuple[int, Any]:
        """A plain JSON POST (used for ``/tokenize``); returns (status, parsed body or None)."""
        resp = self._http.request("POST", self.prefix + path, body=json.dumps(body),
                                  headers={**self._headers, "Accept": "application/json"})
        try:
            raw = resp.read()
        finally:
            resp.release()
        try:
            return resp.status_code, json.loads(raw)
        except ValueError:
            return resp.status_code, None

    def stream_chat(self, body: dict, model: str, request_id: str | None = None,
                    path: str = "/v1/chat/completions") -> RequestRecord:
        """POST a streaming request and time it; never raises for HTTP or network errors."""
        rid = request_id or new_request_id()
        record = RequestRecord(request_id=rid, model=model, t_start_unix=time.time())
        payload = json.dumps(body)
        headers = {**self._headers, "x-request-id": rid}
        t0 = time.perf_counter_ns()
        measurement = StreamMeasurement(record, t0)
        status = 0
        try:
            resp = self._http.request("POST", self.prefix + path, body=payload, headers=headers)
        except Exception as exc:  # connect refused, reset, timeout: no response at all
            record.e2e_s = (time.perf_counter_ns() - t0) / 1e9
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        try:
            status = resp.status_code
            record.ttfb_s = (time.perf_counter_ns() - t0) / 1e9
            if status != 200:
                return self._http_error(record, resp, t0, status)
            self._read_stream(resp, measurement)
        except Exception as exc:  # cut mid-stream, network timeout
            measurement.stream_error = measurement.stream_error or f"{type(exc).__name__}: {exc}"
        finally:
            resp.release()
        return measurement.finish(time.perf_counter_ns(), status)

    @staticmethod
    def _read_stream(resp: Any, measurement: StreamMeasurement) -> None:
        framer = SSEFramer()
        while True:
            line = resp.readline(b"\n")
            events = framer.feed(line) if line else framer.end()  # b"": message complete
            t_ns = time.perf_counter_ns()
            for data, _ in events:
                if data is not None:
                    measurement.on_event(data, t_ns)
            if not line:
                return
            if measurement.done:
                resp.read()  # drain to the end so the connection can be reused
                return

    @staticmethod
    def _http_error(record: RequestRecord, resp: Any, t0: int, status: int) -> RequestRecord:
        raw = resp.read(_MAX_ERROR_BODY) if not resp.message_complete else resp.read()
        record.e2e_s = (time.perf_counter_ns() - t0) / 1e9
        record.status = status
        message = raw[:_MAX_ERROR_BODY].decode("utf-8", errors="replace")
        try:
            err = json.loads(message).get("error")
            message = err.get("message", message) if isinstance(err, dict) else str(err)
        except (ValueError, AttributeError):
            pass
        record.error = f"HTTP {status}: {message[:300]}"
        return record
