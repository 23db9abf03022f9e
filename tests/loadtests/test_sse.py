"""The timing rules on hand-made streams with known timestamps (ns)."""
import json

from loadtests.sse import RequestRecord, StreamMeasurement

MS = 1_000_000


def chunk(delta=None, usage=None, finish=None, text=None, **extra):
    obj = {"choices": [] if delta is None and text is None else
           [{"index": 0, **({"delta": delta} if delta is not None else {"text": text}),
             "finish_reason": finish}]}
    if usage:
        obj["usage"] = usage
    obj.update(extra)
    return json.dumps(obj)


def run(events):
    m = StreamMeasurement(RequestRecord("rid", "m"), 0)
    for t_ms, data in events:
        m.on_event(data, int(t_ms * MS))
    return m.finish(int(events[-1][0] * MS), 200)


def test_role_only_empty_and_keepalive_chunks_do_not_stop_the_clock():
    rec = run([(1, chunk({"role": "assistant", "content": ""})), (2, chunk({"content": ""})),
               (100, chunk({"content": "Hi"})), (110, chunk({"content": " there"})),
               (111, chunk({}, finish="stop")),
               (112, chunk(usage={"prompt_tokens": 5, "completion_tokens": 2})),
               (113, "[DONE]")])
    assert rec.ok and abs(rec.ttft_s - 0.100) < 1e-9
    assert rec.itl_s == [0.010]
    assert rec.tokens_source == "usage" and rec.completion_tokens == 2
    assert rec.prompt_tokens == 5 and rec.finish_reason == "stop"


def test_reasoning_and_tool_calls_count_as_content():
    assert run([(5, chunk({"reasoning_content": "x"})), (6, "[DONE]")]).ttft_s == 0.005
    assert run([(7, chunk({"tool_calls": [{"index": 0}]})), (8, "[DONE]")]).ttft_s == 0.007
    assert run([(9, chunk(text="t")), (10, "[DONE]")]).ttft_s == 0.009  # /v1/completions
    assert run([(11, chunk({"reasoning": "x"})), (12, "[DONE]")]).ttft_s == 0.011
    assert run([(13, chunk({"refusal": "no"})), (14, "[DONE]")]).ttft_s == 0.013


def test_tpot_uses_usage_not_chunk_count():
    # 3 content chunks but the server says 5 tokens (a chunk can carry several tokens)
    rec = run([(100, chunk({"content": "a"})), (120, chunk({"content": "bc"})),
               (140, chunk({"content": "de"})),
               (141, chunk(usage={"prompt_tokens": 1, "completion_tokens": 5})), (142, "[DONE]")])
    assert rec.tokens_source == "usage" and rec.completion_tokens == 5
    assert abs(rec.tpot_s - 0.040 / 4) < 1e-9


def test_chunk_count_fallback_is_marked():
    rec = run([(100, chunk({"content": "a"})), (110, chunk({"content": "b"})), (111, "[DONE]")])
    assert rec.tokens_source == "chunks" and rec.completion_tokens == 2
    assert abs(rec.tpot_s - 0.010) < 1e-9


def test_backend_timings_error_events_and_truncation():
    timings = {"queue_s": 0.01, "prefill_s": 0.02, "first_token_s": 0.035}
    rec = run([(50, chunk({"content": "a"})), (51, chunk({}, finish="stop",
                                                          firsttoken_timings=timings)),
               (52, "[DONE]")])
    assert rec.server_timings == timings
    bad = run([(50, chunk({"content": "a"})), (60, json.dumps({"error": {"message": "cut"}}))])
    assert not bad.ok and "cut" in bad.error
    cut = run([(50, chunk({"content": "a"}))])
    assert not cut.ok and "DONE" in cut.error
