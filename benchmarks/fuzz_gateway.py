"""Property-based fuzzing of the real gateway (fake upstream behind it) with Hypothesis.

    python -m benchmarks.fuzz_gateway [--examples 1000] [--seed 0] [--json PATH]

Bodies are OpenAI chat/completions requests with every field drawn from hostile values
(integers far outside int64, NaN and infinities, lone surrogates, deep nesting, unknown
fields, wrong types), sometimes raw bytes that are not JSON at all or claim a gzip encoding
they do not have; headers carry well-formed, malformed and missing keys (control bytes, bytes
that are not UTF-8, over-long values) and arbitrary extra headers. The property: every answer
is a 200 or a 4xx OpenAI-style error (``{"error": {message, type, param, code}}``), never a
5xx, never a hang; afterwards ``/healthz`` answers and nothing is in flight.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Coroutine, TypeVar

from hypothesis import HealthCheck, given, seed as hyp_seed, settings, strategies as st
from yarl import URL

from benchmarks.rawhttp import Reply, exchange, request_bytes
from gateway import state
from gateway.app import create_app, start_server
from gateway.config import build_config
from fakeupstream import FakeConfig, FakeUpstream

KEY = "sk-fuzz-client"
T = TypeVar("T")
ERROR_FIELDS = {"message", "type", "param", "code"}


class LiveGateway:
    """The fake upstream and the gateway on an event loop thread of their own, so that
    Hypothesis's synchronous examples can drive them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-gateway",
                                        daemon=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="fuzz-"))
        self.url = URL()

    def __enter__(self) -> "LiveGateway":
        self._thread.start()
        self.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    async def _start(self) -> None:
        self.fake = FakeUpstream(FakeConfig(ttft_ms=0, itl_ms=0, tokens=3, record_limit=10))
        await self.fake.start()
        doc = {"keys": [{"name": "fuzz", "env": "FUZZ_KEY"}],
               "providers": {"fake": {"base_url": self.fake.base_url, "max_retries": 0,
                                      "passthrough": True, "timeout_seconds": 10}},
               "models": {"fast": {"provider": "fake", "model": "m"}},
               "request_log": str(self._tmp / "requests.jsonl"),
               "request_log_csv": str(self._tmp / "requests.csv"),
               "shutdown_grace_seconds": 1}
        self.app = create_app(build_config(doc, env={}), env={"FUZZ_KEY": KEY})
        self.runner, url = await start_server(self.app)
        self.url = URL(url)

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.fake.stop()

    def send(self, data: bytes, timeout: float = 15) -> Reply:
        return self.run(exchange(self.url.host, self.url.port, data, timeout=timeout),
                        timeout + 5)

    def in_flight(self) -> float:
        metrics = self.app[state.METRICS]
        return sum(s.value for fam in metrics.in_flight.collect() for s in fam.samples)


# ---- strategies ---------------------------------------------------------------------------
_chars = st.characters(codec=None, categories=None)  # surrogates included
_text = st.text(_chars, max_size=40)
_ints = st.one_of(st.integers(-1000, 1000), st.integers(),
                  st.sampled_from([2 ** 63, 2 ** 63 - 1, -(2 ** 63) - 1, 2 ** 64, -(2 ** 64),
                                   10 ** 30]))
_floats = st.floats(allow_nan=True, allow_infinity=True)
_scalars = st.one_of(st.none(), st.booleans(), _ints, _floats, _text)
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(_text.filter(lambda k: k != "fake"), inner, max_size=4)), max_leaves=20)
_content = st.one_of(_text, _json, st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.one_of(_text, _json)}), max_size=3))
_message = st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), _json),
    "content": _content, "name": _json})
_fields = {
    "model": st.one_of(st.sampled_from(["fast", "fake/x", "nope", "nokey/x"]), _text, _json),
    "messages": st.one_of(st.lists(_message, max_size=3), _json),
    "prompt": st.one_of(_text, st.lists(_text, max_size=3), _json),
    "stream": st.one_of(st.booleans(), _json),
    "stream_options": st.one_of(st.fixed_dictionaries(
        {"include_usage": st.one_of(st.booleans(), _json)}), _json),
    "max_tokens": st.one_of(_ints, _json), "max_completion_tokens": _ints,
    "temperature": st.one_of(_floats, _json), "top_p": _floats, "top_k": _ints,
    "n": _ints, "seed": _ints, "stop": st.one_of(_text, st.lists(_text), _json),
    "logit_bias": _json, "presence_penalty": _floats, "frequency_penalty": _floats,
    "user": _text, "tools": _json, "response_format": _json, "logprobs": _json,
}
_bodies = st.fixed_dictionaries({}, optional=_fields).flatmap(
    lambda known: st.dictionaries(_text.filter(lambda k: k not in _fields and k != "fake"),
                                  _json, max_size=3).map(lambda extra: {**extra, **known}))
_sane = st.fixed_dictionaries(
    {"model": st.sampled_from(["fast", "fake/x"])},
    optional={"stream": st.booleans(), "max_tokens": st.integers(1, 50),
              "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
              "seed": st.integers(-(2 ** 63), 2 ** 63 - 1), "user": _text,
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
              "stop": st.lists(st.text(max_size=5), max_size=2)})
# A sane request, alone or with one hostile field: what gets past the door to the relay.
_near_sane = st.tuples(_sane, st.dictionaries(st.sampled_from(sorted(_fields)), _json,
                                              max_size=1)).map(lambda t: {**t[0], **t[1]})
_header_bytes = st.binary(max_size=60).filter(lambda b: b"\r" not in b and b"\n" not in b)
_bad_auth = st.one_of(
    st.just(f"bearer {KEY}".encode()), st.just(KEY.encode()),
    st.builds(lambda b: b"Bearer " + b, _header_bytes),
    st.builds(lambda n: b"Bearer " + b"k" * n, st.integers(1000, 9000)), st.just(b""))
_KEY_HEADERS = ["Authorization", "x-api-key", "api-key"]
_names = st.from_regex(r"\A[A-Za-z0-9-]{1,20}\Z").filter(
    lambda n: n.lower() not in {"content-length", "transfer-encoding", "host", "connection",
                                "expect", "upgrade"} and not n.lower().startswith("x-fake"))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    body_obj = draw(st.one_of(_near_sane, _bodies))
    if "messages" not in body_obj and "prompt" not in body_obj and draw(st.booleans()):
        body_obj["messages" if path.endswith("chat/completions") else "prompt"] = \
            [{"role": "user", "content": draw(_text)}] if path.endswith("chat/completions") \
            else draw(_text)
    if draw(st.booleans()) and "model" not in body_obj:
        body_obj["model"] = "fast"
    if path.endswith("chat/completions") and "messages" not in body_obj and draw(st.booleans()):
        body_obj["messages"] = [{"role": "user", "content": "hi"}]
    if path.endswith("/completions") and "prompt" not in body_obj and draw(st.booleans()):
        body_obj["prompt"] = "hi"
    body = json.dumps(body_obj).encode()
    shape = draw(st.sampled_from(["json", "json", "json", "truncated", "bytes", "deep",
                                  "gzip", "gzip_label"]))
    headers: dict[str, bytes | str] = {"Content-Type": draw(st.sampled_from(
        ["application/json", "text/plain", "application/json; charset=latin-1", ""]))}
    if shape == "truncated":
        body = body[:draw(st.integers(0, max(len(body) - 1, 0)))]
    elif shape == "bytes":
        body = draw(st.binary(max_size=200))
    elif shape == "deep":
        depth = draw(st.integers(60, 3000))
        body = b'{"model": "fast", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    elif shape == "gzip":
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    elif shape == "gzip_label":
        headers["Content-Encoding"] = "gzip"
    key_header = draw(st.sampled_from(_KEY_HEADERS))
    kind = draw(st.sampled_from(["good"] * 3 + ["bad", "none"]))
    if kind == "good":  # mostly a valid key, so that bodies get past authentication
        headers[key_header] = f"Bearer {KEY}" if key_header == "Authorization" else KEY
    elif kind == "bad":
        headers[key_header] = draw(_bad_auth)
    for name, value in draw(st.dictionaries(_names, _header_bytes, max_size=3)).items():
        headers.setdefault(name, value)
    return request_bytes(path, body, headers)


def check(reply: Reply) -> str:
    """The property; returns the outcome's name for the counts."""
    assert not reply.timed_out, "no answer in time"
    assert reply.status, "no response"
    assert reply.status < 500, (reply.status, reply.body[:300])
    if reply.status == 200:
        return "200"
    err = json.loads(reply.body)["error"]
    assert set(err) == ERROR_FIELDS, err
    assert 400 <= reply.status < 500
    return str(reply.status)


def fuzz(examples: int = 1000, seed: int | None = None) -> dict[str, Any]:
    """Run ``examples`` cases against a fresh gateway; returns counts (raises on a failure)."""
    counts: Counter[str] = Counter()
    with LiveGateway() as gw:
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), derandomize=seed is None)
        @given(requests())
        def case(data: bytes) -> None:
            counts[check(gw.send(data))] += 1

        if seed is not None:
            case = hyp_seed(seed)(case)
        case()
        health = gw.send(request_bytes("/healthz", b"", {}, "GET"))
        in_flight = gw.in_flight()
    assert health.status == 200 and in_flight == 0, (health.status, in_flight)
    return {"examples": sum(counts.values()), "statuses": dict(sorted(counts.items())),
            "5xx": sum(v for k, v in counts.items() if k.startswith("5")),
            "healthz_after": health.status, "in_flight_after": in_flight}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=None,
                   help="Hypothesis seed (default: derandomized, the same cases every run)")
    p.add_argument("--json", help="write the counts here")
    a = p.parse_args(argv)
    result = fuzz(a.examples, a.seed)
    result["command"] = "python -m benchmarks.fuzz_gateway " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
