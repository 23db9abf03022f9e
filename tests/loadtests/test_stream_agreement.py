"""The gateway and the load tester stop the TTFT clock on the same event, for every kind of
stream a provider sends: both parse with ``openai_stream``, and this checks it end to end.

A recorded stream of each kind is replayed by a raw upstream: a non-content event at 0.15 s
(role-only, empty content, a keep-alive comment), the first content-bearing event at 0.45 s,
more after. A rule that counted the early event would report ~0.15 s; one that missed the
content field would report ~0.75 s or fail. The Locust client (``loadtests.client``) reads the
stream through a real gateway process and both records must put the first token at ~0.45 s.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from loadtests.client import StreamingChatClient
from tests.loadtests.conftest import CLIENT_KEY, read_jsonl

EARLY, FIRST, LATER = 0.15, 0.45, 0.75


def _event(delta: dict | None = None, finish: str | None = None, usage: dict | None = None,
           choices: bool = True) -> bytes:
    obj: dict = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
                 if choices else []}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


ROLE = _event({"role": "assistant", "content": ""})
USAGE = _event(usage={"prompt_tokens": 3, "completion_tokens": 4}, choices=False)
FINISH = _event({}, finish="stop")
TOOL = {"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}

# kind -> (what comes at EARLY, the first content event at FIRST, what follows at LATER)
STREAMS: dict[str, tuple[bytes, bytes, bytes]] = {
    "role_only_first": (ROLE, _event({"content": "Paris"}), _event({"content": "!"})),
    "reasoning_first": (ROLE, _event({"reasoning": "thinking"}), _event({"content": "Paris"})),
    "reasoning_content_first": (_event({"content": ""}), _event({"reasoning_content": "hm"}),
                                _event({"content": "Paris"})),
    "tool_calls_first": (ROLE, _event({"tool_calls": [TOOL]}), _event({"content": "x"})),
    "refusal_first": (b": keep-alive\n\n", _event({"refusal": "I can't"}),
                      _event({"content": "."})),
    "usage_only_last": (ROLE, _event({"content": "Paris"}), USAGE),
}


class _Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        kind = self.server.kinds.pop(0)  # type: ignore[attr-defined]
        early, first, later = STREAMS[kind]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        t0 = time.monotonic()
        for at, part in ((0.0, b""), (EARLY, early), (FIRST, first), (LATER, later),
                         (LATER, FINISH), (LATER, USAGE), (LATER, b"data: [DONE]\n\n")):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if part:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replay() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    server.kinds = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_gateway_and_load_tester_agree_on_the_first_token(replay, lt_gateway):
    gw_url, request_log = lt_gateway(f"http://127.0.0.1:{replay.server_port}")
    client = StreamingChatClient(gw_url, api_key=CLIENT_KEY)
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}
    seen = {}
    try:
        for kind in STREAMS:
            replay.kinds.append(kind)
            seen[kind] = client.stream_chat(body, "fast", request_id=f"agree-{kind}")
    finally:
        client.close()
    rows: dict[str, dict] = {}
    deadline = time.monotonic() + 5
    while len(rows) < len(STREAMS) and time.monotonic() < deadline:
        time.sleep(0.05)  # the gateway writes its row just after the last byte
        if request_log.exists():
            rows = {r["request_id"]: r for r in read_jsonl(request_log)}
    for kind, rec in seen.items():
        row = rows[f"agree-{kind}"]
        assert rec.ok and row["status"] == 200, (kind, rec.error, row)
        # both stop on the event sent at FIRST, not the one at EARLY or LATER
        assert FIRST <= rec.ttft_s < LATER - 0.1, (kind, rec.ttft_s)
        assert FIRST <= row["ttft_s"] < LATER - 0.1, (kind, row["ttft_s"])
        assert rec.ttft_s >= row["ttft_s"]  # the client is one hop behind the gateway
        assert rec.completion_tokens == row["completion_tokens"] == 4, kind
