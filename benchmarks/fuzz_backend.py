"""Property-based fuzzing of the backend's OpenAI endpoints with Hypothesis: chat and
completion bodies (streamed and not), with every field drawn from valid values, edge values
and junk, plus raw byte bodies and odd headers. Every answer must be a 200 or an OpenAI-style
4xx, never a 5xx, never a hang; the server must be alive afterwards with every KV block free.

    python -m benchmarks.fuzz_backend --cases 1000 \
        --json docs/benchmarks/reliability/fuzz_backend.json

Valid requests ask for at most 3 tokens, so a case costs milliseconds of model time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from benchmarks.backend_target import MODEL, BackendTarget, machine, write_result

REQUEST_TIMEOUT_S = 60.0  # a case slower than this counts as a hang
ERROR_KEYS = {"message", "type", "param", "code"}

_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                          st.floats(allow_nan=True, allow_infinity=True))
junk = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
huge_ints = st.one_of(st.integers(min_value=2**31), st.integers(max_value=-2**31),
                      st.sampled_from([2**63 - 1, 2**63, 2**64, -2**63 - 1, -2**64]))
text = st.text(max_size=40)  # surrogates included: they reach the server as \\udxxx escapes


def _maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(strategy, junk)


def _optional(**fields: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional=fields)


SAMPLING = _optional(
    temperature=_maybe(st.one_of(st.floats(0, 2), st.floats(allow_nan=True,
                                                             allow_infinity=True))),
    top_p=_maybe(st.floats(allow_nan=True, allow_infinity=True)),
    top_k=_maybe(st.one_of(st.integers(-2, 100), huge_ints)),
    seed=_maybe(st.one_of(st.integers(-2**63, 2**63 - 1), huge_ints)),
    min_tokens=_maybe(st.integers(-1, 3)),
    n=_maybe(st.integers(-1, 3)),
    logprobs=_maybe(st.one_of(st.booleans(), st.integers(0, 5))),
    presence_penalty=_maybe(st.floats(-3, 3)),
    frequency_penalty=_maybe(st.floats(allow_nan=True)),
    stop=_maybe(st.one_of(text, st.lists(text, max_size=3))),
    stop_token_ids=_maybe(st.lists(st.one_of(st.integers(-1, 50000), huge_ints), max_size=3)),
    ignore_eos=_maybe(st.booleans()),
    stream_options=_maybe(st.fixed_dictionaries({}, optional={"include_usage": junk})),
    user=_maybe(text),
    extra_field=junk,
)
# Valid values stay tiny (a case must be cheap); invalid ones are anything.
MAX_TOKENS = st.one_of(st.integers(1, 3), st.integers(max_value=0), huge_ints,
                       st.floats(allow_nan=True), st.text(max_size=3))
MODEL_NAME = st.one_of(st.just(MODEL), st.just(MODEL), text, junk)
_part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}), junk)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                           "content": st.one_of(text, st.lists(_part, max_size=2))}),
    st.fixed_dictionaries({"role": _maybe(text)}, optional={"content": junk}), junk)


@st.composite
def request_case(draw: st.DrawFn) -> tuple[str, dict, bytes]:
    """(path, headers, body bytes)."""
    headers = draw(st.fixed_dictionaries({}, optional={
        "x-request-id": st.text(st.characters(min_codepoint=33, max_codepoint=126),
                                max_size=200),
        "content-type": st.sampled_from(["application/json", "text/plain", "x/y"])}))
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    # Hypothesis starts from (and shrinks toward) small draws: 0 is the plain valid body.
    mode = draw(st.integers(0, 9))
    if mode == 9:  # raw bytes: not JSON at all, or truncated JSON
        return path, headers, draw(st.one_of(st.binary(max_size=200),
                                             st.just(b'{"model": "x", "messages": [')))
    body = draw(VALID_CHAT if path == "/v1/chat/completions" else VALID_COMPLETION)
    if mode >= 6:  # every field wild
        body = {"model": draw(MODEL_NAME), "max_tokens": draw(MAX_TOKENS),
                "stream": draw(_maybe(st.booleans())), **draw(SAMPLING)}
        if path == "/v1/chat/completions":
            body["messages"] = draw(_maybe(st.lists(MESSAGE, min_size=0, max_size=3)))
        else:
            body["prompt"] = draw(_maybe(st.one_of(
                text, st.lists(st.integers(-5, 60000), max_size=5),
                st.lists(text, max_size=2))))
    elif mode >= 2:  # a valid body with one field wild (it reaches the deeper checks)
        wild = draw(st.one_of(SAMPLING.filter(bool), st.fixed_dictionaries(
            {}, optional={"max_tokens": MAX_TOKENS, "model": MODEL_NAME,
                          "messages": st.lists(MESSAGE, max_size=3), "prompt": junk,
                          "stream": junk}).filter(bool)))
        key = draw(st.sampled_from(sorted(wild)))
        body[key] = wild[key]
    # else: the valid body as it is
    if "max_tokens" in body and draw(st.integers(0, 4)) == 0:
        body["max_completion_tokens"] = body.pop("max_tokens")
    return path, headers, json.dumps(body).encode()


_VALID_SAMPLING = _optional(
    temperature=st.floats(0, 2), top_p=st.floats(0.01, 1), top_k=st.integers(-1, 50),
    seed=st.integers(-2**63, 2**63 - 1), min_tokens=st.integers(0, 1),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=2), ignore_eos=st.booleans(),
    presence_penalty=st.floats(-2, 2),
    stream_options=st.fixed_dictionaries({"include_usage": st.booleans()}))
_VALID_COMMON = st.fixed_dictionaries({"model": st.just(MODEL),
                                       "max_tokens": st.integers(1, 3),
                                       "stream": st.booleans()})
VALID_CHAT = st.builds(lambda c, s, m: {**c, **s, "messages": m}, _VALID_COMMON,
                       _VALID_SAMPLING, st.lists(st.fixed_dictionaries(
                           {"role": st.just("user"), "content": text}), min_size=1,
                           max_size=2))
VALID_COMPLETION = st.builds(lambda c, s, p: {**c, **s, "prompt": p}, _VALID_COMMON,
                             _VALID_SAMPLING, st.one_of(st.text(min_size=1, max_size=40),
                                                        st.lists(st.integers(1, 40000),
                                                                 min_size=1, max_size=5)))


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)  # 5xx, hangs, malformed answers

    def as_dict(self) -> dict:
        return {"cases": sum(self.statuses.values()),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "bad": len(self.bad), "bad_samples": self.bad[:10]}


def send(client: httpx.Client, url: str, path: str, headers: dict,
         body: bytes) -> tuple[str, str]:
    """Send one case: (its status or "hang", '' when the answer is acceptable, else what is
    wrong with it)."""
    try:
        with client.stream("POST", url + path, content=body, headers=headers,
                           timeout=REQUEST_TIMEOUT_S) as resp:
            raw = resp.read()
            status = resp.status_code
    except httpx.TimeoutException:
        return "hang", f"no answer within {REQUEST_TIMEOUT_S:g} s"
    except httpx.TransportError as exc:  # the server reset or closed the connection
        return "reset", f"{type(exc).__name__}: {exc}"
    if status >= 500:
        return str(status), f"a server error: {raw[:300]!r}"
    if status == 200:
        if raw.startswith(b"data: "):
            ok = raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw
            return "200", "" if ok else f"a stream without [DONE] or with an error: " \
                f"{raw[-300:]!r}"
        return "200", "" if b'"choices"' in raw else f"no choices: {raw[:300]!r}"
    try:
        error = json.loads(raw)["error"]
        ok = set(error) == ERROR_KEYS and bool(error["message"]) and 400 <= status < 500
    except (ValueError, KeyError, TypeError):
        ok = False
    return str(status), "" if ok else f"not an OpenAI error body: {raw[:300]!r}"


def fuzz(url: str, cases: int, tally: Tally, stop_on_bad: bool, seed: int | None = None
         ) -> None:
    """Run `cases` Hypothesis examples against url; with stop_on_bad the first bad answer
    fails (and Hypothesis shrinks it), else every bad answer is only counted. Without a
    seed the cases are the same every run."""
    with httpx.Client() as client:
        @settings(max_examples=cases, deadline=None, database=None,
                  derandomize=seed is None, suppress_health_check=list(HealthCheck),
                  print_blob=True)
        @given(request_case())
        def one(case: tuple[str, dict, bytes]) -> None:
            path, headers, body = case
            status, problem = send(client, url, path, headers, body)
            tally.statuses[status] += 1
            if problem:
                tally.bad.append(f"{status} {path} {body[:200]!r}: {problem}")
                assert not stop_on_bad, f"{status}: {problem}"

        if seed is not None:
            one = hyp_seed(seed)(one)
        one()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_backend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=None,
                   help="Hypothesis seed (default: derandomized, the same cases every run)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    log_path = os.path.join(tempfile.mkdtemp(prefix="fuzz-"), "backend.log")
    tally = Tally()
    with BackendTarget(log_path) as target:
        t0 = time.monotonic()
        fuzz(target.base_url, args.cases, tally, stop_on_bad=False, seed=args.seed)
        elapsed = time.monotonic() - t0
        idle = target.wait_idle()
        result = {**tally.as_dict(), "duration_s": round(elapsed, 1),
                  "backend_alive": target.alive, "leaked_kv_blocks": idle.kv_blocks_used,
                  "log_error_lines": len(target.error_lines()),
                  "machine": machine()}
    write_result(args.json, result)
    print(f"{result['cases']} fuzzed requests in {result['duration_s']} s: statuses "
          f"{result['statuses']}; {result['bad']} bad (5xx, hang or malformed); backend alive: "
          f"{result['backend_alive']}; leaked KV blocks {result['leaked_kv_blocks']}")
    return result


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["bad"] == 0 and res["backend_alive"] and res["leaked_kv_blocks"] == 0
             else 1)
