"""Fault matrix through the real gateway: every request ends with the right status and record,
none hangs, nothing leaks.

    python -m benchmarks.chaos [--requests 10000] [--concurrency 100] [--json PATH]

One process and event loop hold the fake upstream (fakeupstream/server.py), the gateway
and a raw-socket client (benchmarks/rawhttp.py). The client cycles through the scenarios
below: upstream faults (refused port, reset before headers, hang before headers and before
the first token, 429, 5xx, a request that broke an engine step, malformed SSE, cut mid-stream,
slow drip) and client hang-ups at every phase (during the body, before the response head,
after it, mid-stream, right after ``[DONE]``). Checks, printed and written as JSON:

* every request's record exists once (joined by ``x-request-id``) with the expected status,
  and the client saw the expected status / stream ending (``misrecorded``);
* no request outlives ``--hang-after`` seconds (``hung``), the in-flight gauge ends at 0;
* no connection or file descriptor leaks: client connections all closed, every upstream
  connection still open is idle in the pool, and once the pool is closed the process holds as
  many descriptors as before the run;
* ``gateway_requests_total`` = request-log lines = requests sent.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from yarl import URL

from benchmarks.rawhttp import Reply, exchange, request_bytes
from gateway import state
from gateway.app import create_app, start_server
from gateway.config import build_config
from fakeupstream import FakeConfig, FakeUpstream

KEY = "sk-chaos-client"
MSG = [{"role": "user", "content": "hello there"}]
TOKENS = 6


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    stream: bool
    fake: dict[str, Any]
    record: int                    # the request log's status
    client: int | None             # the status the client sees (None: it hung up first)
    done: bool = False             # a stream that must end with [DONE] (else: error event)
    retries: int | None = None
    abort: dict[str, Any] = field(default_factory=dict)  # rawhttp.exchange hang-up options
    raw_body: bytes | None = None


SCENARIOS = [
    Scenario("ok_stream", "ok", True, {}, 200, 200, done=True, retries=0),
    Scenario("ok_json", "ok", False, {}, 200, 200, retries=0),
    Scenario("slow_drip", "ok", True, {"itl_ms": 25, "tokens": TOKENS}, 200, 200, done=True),
    Scenario("refused", "dead", True, {}, 502, 502, retries=1),
    Scenario("reset", "ok", True, {"fault": "close"}, 502, 502, retries=1),
    Scenario("hang_headers", "ok", True, {"fault": "hang"}, 504, 504, retries=1),
    Scenario("hang_first_token", "ok", True, {"fault": "stall_first"}, 504, 200),
    Scenario("rate_limited", "ok", False, {"fault": "429", "retry_after": 7}, 429, 429,
             retries=0),
    Scenario("rate_limited_failover", "pair", True, {"fault": "429", "fail_times": 1}, 200,
             200, done=True, retries=1),
    Scenario("server_error", "ok", False, {"fault": "500"}, 502, 502, retries=1),
    Scenario("server_error_once", "ok", True, {"fault": "503", "fail_times": 1}, 200, 200,
             done=True, retries=1),
    Scenario("step_failed", "pair", True, {"fault": "step_failed"}, 502, 502, retries=0),
    Scenario("malformed_sse", "ok", True, {"fault": "malformed"}, 502, 200),
    Scenario("cut_mid_stream", "ok", True, {"fault": "cut"}, 502, 200),
    Scenario("bad_json", "ok", False, {}, 400, 400, raw_body=b'{"model": "ok", '),
    Scenario("abort_in_body", "ok", True, {}, 499, None, abort={"abort_after_s": 0.1,
                                                                 "send_only": -10}),
    Scenario("abort_before_head", "ok", True, {"fault": "hang"}, 499, None,
             abort={"abort_after_s": 0.1}),
    Scenario("abort_after_head", "ok", True, {"ttft_ms": 300}, 499, None,
             abort={"abort_at_head": True}),
    Scenario("abort_mid_stream", "ok", True, {"itl_ms": 20, "tokens": 10}, 499, None,
             abort={"abort_at": b"t2 "}),
    Scenario("abort_after_done", "ok", True, {"tail_ms": 20}, 200, None, done=True,
             abort={"abort_at": b"data: [DONE]"}),
]


def _closed_port() -> int:
    """A loopback port with nothing listening: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def gateway_config(fake_url: str, log_path: Path,
                   first_token_timeout: float = 1.0) -> dict[str, Any]:
    provider = {"max_retries": 1, "timeout_seconds": max(10.0, 4 * first_token_timeout),
                "first_token_timeout_seconds": first_token_timeout,
                "connect_timeout_seconds": 2 * first_token_timeout}
    return {
        "keys": [{"name": "chaos", "env": "CHAOS_KEY"}],
        "providers": {"fake": {"base_url": fake_url, **provider},
                      "dead": {"base_url": f"http://127.0.0.1:{_closed_port()}", **provider}},
        "models": {"ok": {"provider": "fake", "model": "m"},
                   "dead": {"provider": "dead", "model": "m"},
                   "pair": [{"provider": "fake", "model": "x"},
                            {"provider": "fake", "model": "y"}]},
        "retry": {"backoff_base_seconds": 0.01, "backoff_max_seconds": 0.05},
        "request_log": str(log_path),
        "shutdown_grace_seconds": 2,
    }


def _request(sc: Scenario, rid: str) -> bytes:
    body = sc.raw_body if sc.raw_body is not None else json.dumps(
        {"model": sc.model, "messages": MSG, "stream": sc.stream,
         "fake": {"ttft_ms": 1, "itl_ms": 1, "tokens": TOKENS, **sc.fake}}).encode()
    return request_bytes("/v1/chat/completions", body,
                         {"Authorization": f"Bearer {KEY}", "Content-Type":
                          "application/json", "x-request-id": rid})


def _client_wrong(sc: Scenario, r: Reply) -> str | None:
    if sc.client is None:
        return None
    if r.status != sc.client:
        return f"client status {r.status} != {sc.client}"
    if sc.stream and sc.client == 200:
        has_done = r.body.rstrip().endswith(b"data: [DONE]")
        if has_done != sc.done:
            return "stream end: " + ("[DONE]" if has_done else "no [DONE]")
        if not sc.done and b'"error"' not in r.body:
            return "failed stream without an error event"
    return None


def _record_wrong(sc: Scenario, row: dict[str, Any] | None) -> str | None:
    if row is None:
        return "no record"
    if row["status"] != sc.record:
        return f"record status {row['status']} != {sc.record}"
    if sc.retries is not None and row["retries"] != sc.retries:
        return f"record retries {row['retries']} != {sc.retries}"
    if sc.record == 200 and sc.stream and (row["ttft_s"] is None or row["e2e_s"] is None
                                           or not row["completion_tokens"]):
        return "200 stream without ttft/e2e/tokens"
    return None


async def _watch_loop(stalls: list[float], period: float = 0.01) -> None:
    """Records how late the loop wakes up: a stall past the first-token timeout makes healthy
    requests time out and be retried, which the result must be able to tell apart."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period)
        stalls.append(loop.time() - t - period)


async def run_chaos(requests: int = 10_000, concurrency: int = 100,
                    hang_after: float = 30.0,
                    first_token_timeout: float = 1.0) -> dict[str, Any]:
    """Run the matrix; returns the result document (see the module docstring).

    ``first_token_timeout`` is the providers' time to response headers and to the first token;
    the hang scenarios wait it out (twice for hangs before headers, which are retried).
    """
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    log_path = tmp / "requests.jsonl"
    fake = FakeUpstream(FakeConfig(ttft_ms=1, itl_ms=1, tokens=TOKENS, record_limit=10))
    await fake.start()
    app = create_app(build_config(gateway_config(fake.base_url, log_path,
                                                       first_token_timeout), env={}),
                     env={"CHAOS_KEY": KEY})
    runner, url = await start_server(app)
    base = URL(url)
    fds_before = _fds()
    rows_expected: dict[str, Scenario] = {}
    client_problems: dict[str, str] = {}
    hung: list[str] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        sc = SCENARIOS[i % len(SCENARIOS)]
        rid = f"chaos-{i}-{sc.name}"
        rows_expected[rid] = sc
        data = _request(sc, rid)
        abort = dict(sc.abort)
        if abort.get("send_only", 0) < 0:
            abort["send_only"] += len(data)
        async with sem:
            try:
                async with asyncio.timeout(hang_after):
                    reply = await exchange(base.host, base.port, data, timeout=hang_after,
                                           **abort)
            except TimeoutError:
                hung.append(rid)
                return
        if reply.timed_out:
            hung.append(rid)
        elif (why := _client_wrong(sc, reply)) is not None:
            client_problems[rid] = why

    levels: Counter[str] = Counter()
    counter = _CountingHandler(levels)
    logging.getLogger("gateway").addHandler(counter)
    stalls: list[float] = []
    watch = asyncio.create_task(_watch_loop(stalls))
    # The heap built before the run (a test process's, say) is left out of the collector's
    # full passes during it: they would stall this one loop that serves every request.
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        wall = time.perf_counter() - t0
        gc.unfreeze()
        watch.cancel()
    # Let hang-ups reach the gateway and the upstream, and the last records be written.
    metrics = app[state.METRICS]
    for _ in range(100):
        await asyncio.sleep(0.05)
        if _gauge_total(metrics) == 0 and fake.stats.open_streams == 0 and \
                not runner.server.connections:  # type: ignore[union-attr]
            break
    await asyncio.sleep(1.1)  # release_after_body timers run out; the log flushes
    app[state.REQUEST_LOG].flush()
    lines = log_path.read_text().splitlines()
    rows: dict[str, dict[str, Any]] = {}
    duplicates = 0
    for line in lines:
        row = json.loads(line)
        duplicates += row["request_id"] in rows
        rows[row["request_id"]] = row
    misrecorded: dict[str, str] = {}
    for rid, sc in rows_expected.items():
        why = client_problems.get(rid) or _record_wrong(sc, rows.get(rid))
        if why is not None and rid not in hung:
            misrecorded[rid] = why
    text = generate_latest(metrics.registry).decode()
    requests_total = sum(float(x.split()[-1]) for x in text.splitlines()
                         if x.startswith("gateway_requests_total{"))
    open_conns, idle_conns = app[state.POOL].counts()
    client_conns = len(runner.server.connections)  # type: ignore[union-attr]
    in_flight_end = _gauge_total(metrics)
    fake_open = fake.stats.open_streams
    await app[state.POOL].close()
    await asyncio.sleep(0.3)
    fds_after = _fds()
    await runner.cleanup()
    await fake.stop()
    logging.getLogger("gateway").removeHandler(counter)
    by_scenario = Counter(sc.name for sc in rows_expected.values())
    wrong_by_scenario = Counter(rid.split("-", 2)[2] for rid in misrecorded)
    return {
        "requests": requests, "concurrency": concurrency, "wall_s": round(wall, 2),
        "first_token_timeout_s": first_token_timeout,
        "loop_stall_max_s": round(max(stalls, default=0.0), 3),
        "scenarios": {s.name: {"sent": by_scenario[s.name],
                               "misrecorded": wrong_by_scenario[s.name]} for s in SCENARIOS},
        "hung": len(hung), "misrecorded": len(misrecorded),
        "misrecorded_examples": dict(list(misrecorded.items())[:10]),
        "hung_examples": hung[:10],
        "duplicate_records": duplicates,
        "log_lines": len(lines), "gateway_requests_total": int(requests_total),
        "in_flight_at_end": in_flight_end, "client_connections_at_end": client_conns,
        "upstream_connections_at_end": open_conns, "upstream_idle_at_end": idle_conns,
        "upstream_streams_open_at_end": fake_open,
        "fds_before": fds_before, "fds_after": fds_after,
        "leaked_fds": fds_after - fds_before,
        "leaked_connections": client_conns + (open_conns - idle_conns),
        "gateway_log_lines": dict(levels),
    }


class _CountingHandler(logging.Handler):
    """Counts the gateway's log lines by level (an upstream failure is one WARNING line)."""

    def __init__(self, levels: Counter[str]) -> None:
        super().__init__(logging.DEBUG)
        self.levels = levels

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1


def _gauge_total(metrics: Any) -> float:
    return sum(s.value for fam in metrics.in_flight.collect() for s in fam.samples)


def passed(result: dict[str, Any]) -> bool:
    return (result["hung"] == 0 and result["misrecorded"] == 0
            and result["duplicate_records"] == 0 and result["leaked_fds"] <= 0
            and result["leaked_connections"] == 0 and result["in_flight_at_end"] == 0
            and result["upstream_streams_open_at_end"] == 0
            and result["gateway_log_lines"].get("ERROR", 0) == 0
            and result["gateway_requests_total"] == result["log_lines"] == result["requests"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--hang-after", type=float, default=30.0,
                   help="seconds after which a request counts as hung")
    p.add_argument("--first-token-timeout", type=float, default=1.0,
                   help="the providers' seconds to response headers and to the first token")
    p.add_argument("--json", help="write the result document here")
    a = p.parse_args(argv)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    result = runner(run_chaos(a.requests, a.concurrency, a.hang_after,
                                a.first_token_timeout))
    result.update(passed=passed(result), command="python -m benchmarks.chaos " +
                  " ".join(argv if argv is not None else sys.argv[1:]),
                  machine=f"{platform.machine()} {os.cpu_count()} CPUs, Python "
                          f"{platform.python_version()}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'scenario':24} {'sent':>6} {'misrecorded':>11}")
    for name, row in result["scenarios"].items():
        print(f"{name:24} {row['sent']:>6} {row['misrecorded']:>11}")
    print(f"requests {result['requests']} at {result['concurrency']} concurrent in "
          f"{result['wall_s']} s: hung {result['hung']}, misrecorded {result['misrecorded']}, "
          f"leaked fds {result['leaked_fds']}, leaked connections "
          f"{result['leaked_connections']}; gateway_requests_total "
          f"{result['gateway_requests_total']}, log lines {result['log_lines']}; longest loop "
          f"stall {result['loop_stall_max_s']} s")
    for rid, why in result["misrecorded_examples"].items():
        print(f"  {rid}: {why}")
    print("PASS" if result["passed"] else "FAIL")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
