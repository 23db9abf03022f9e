"""Locust scenario: streaming OpenAI chat requests, timed truthfully.

    locust -f loadtests/chat.py --host http://127.0.0.1:8080 --model smollm2 \\
        --prompt-tokens 512 --output-tokens 256 --records runs/records.jsonl

Each request streams (``stream: true`` with ``stream_options.include_usage``) and is parsed line
by line as bytes arrive (see ``loadtests.client``). Per request we record TTFT to the first
content-bearing delta, TPOT from ``usage.completion_tokens``, every ITL gap, E2E, tokens and
status, with an ``x-request-id`` that joins client, gateway and backend records.

Locust statistics, per model: ``POST <model>`` is the request itself (response time = E2E);
``TTFT <model>``, ``TPOT <model>`` and ``E2E <model>`` are logged straight into their own stats
entries, *not* through ``events.request``, so Locust's Total row and its request rate count each
request once. ``WARMUP <model>`` shows warm-up requests the same way; they never enter the
records' percentiles. Locust rounds these times; the raw JSONL records and the summary file
(``<records>.summary.json``) do not. See docs/LOADTESTS.md for every flag.
"""
from __future__ import annotations

import time
from typing import Any

import gevent
from locust import User, constant, events, task

from loadtests import settings as settings_mod
from loadtests.client import StreamingChatClient
from loadtests.runstate import RECORDS_MESSAGE, RunState
from loadtests.sse import RequestRecord


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    settings_mod.add_arguments(parser)


@events.init.add_listener
def _on_init(environment: Any, **_kw: Any) -> None:
    state = RunState(environment)
    environment.firsttoken = state
    if environment.runner is not None:
        environment.runner.register_message(RECORDS_MESSAGE, state.on_records_message)


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kw: Any) -> None:
    environment.firsttoken.on_test_start()


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_kw: Any) -> None:
    environment.firsttoken.on_test_stop()


@events.quitting.add_listener
def _on_quitting(environment: Any, **_kw: Any) -> None:
    environment.firsttoken.on_quitting()


def request_body(state: RunState) -> tuple[dict, str]:
    """The JSON body for the next request and its path."""
    s = state.settings
    assert s is not None and state.prompts is not None
    body: dict[str, Any] = {"model": s.model, "stream": True,
                            "stream_options": {"include_usage": True},
                            "max_tokens": s.output_tokens, "temperature": 0}
    if s.ignore_eos:  # force the output length (our backend, vLLM); others ignore them
        body.update(min_tokens=s.output_tokens, ignore_eos=True)
    if s.endpoint == "chat":
        body["messages"] = state.prompts.messages()
        return body, "/v1/chat/completions"
    body["prompt"] = state.prompts.next_prompt()
    return body, "/v1/completions"


def report_to_locust(environment: Any, rec: RequestRecord) -> None:
    """One ``events.request`` per request; derived metrics go straight into their entries."""
    e2e_ms = (rec.e2e_s or 0.0) * 1000
    stats = environment.stats
    if rec.phase == "warmup":
        stats.get(rec.model, "WARMUP").log(e2e_ms, 0)
        return
    exc = None if rec.ok else RuntimeError(rec.error or "failed")
    environment.events.request.fire(
        request_type="POST", name=rec.model, response_time=e2e_ms,
        response_length=rec.completion_tokens or 0, exception=exc,
        context={"request_id": rec.request_id})
    if not rec.ok:
        return
    for kind, value in (("TTFT", rec.ttft_s), ("TPOT", rec.tpot_s), ("E2E", rec.e2e_s)):
        if value is not None:  # bypasses stats.total: the request rate stays honest
            stats.get(rec.model, kind).log(value * 1000, 0)


class ChatUser(User):
    """Sends streaming chat requests back to back (closed loop) or on the open-loop schedule."""

    wait_time = constant(0)

    def on_start(self) -> None:
        state: RunState = self.environment.firsttoken
        state.prepare(self.host)
        s = state.settings
        assert s is not None
        self.client = StreamingChatClient(self.host, s.api_key, timeout_s=s.request_timeout)

    def on_stop(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()

    @task
    def chat(self) -> None:
        state: RunState = self.environment.firsttoken
        s = state.settings
        assert s is not None
        phase, slot = state.take_ticket()
        queue_s = 0.0
        if slot is not None:
            wait = slot - time.perf_counter()
            if wait > 0:  # slot in the future: any lateness on waking is scheduler lag
                gevent.sleep(wait)
                state.monitor.note_wakeup_late(time.perf_counter() - slot)
            queue_s = max(0.0, time.perf_counter() - slot)  # all users were busy, or lag
        body, path = request_body(state)
        rec = self.client.stream_chat(body, s.model, path=path)
        rec.phase, rec.queue_s, rec.arrival = phase, queue_s, s.arrival
        rec.worker = state.worker_index
        report_to_locust(self.environment, rec)
        state.emit(rec)
