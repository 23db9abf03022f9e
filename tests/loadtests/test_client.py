"""The streaming client against the delay-injecting fake upstream (real sockets)."""
from loadtests.client import StreamingChatClient

BODY = {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": 4}


def test_ttft_is_not_delayed_by_buffering(lt_fake):
    # ITL 300 ms: a client that waits for a full read buffer (FastHttpUser's iter_content(1024))
    # would only see the first chunk after several more arrive, i.e. TTFT >= 400 ms.
    url, fake = lt_fake(ttft_ms=100, itl_ms=300, tokens=4)
    c = StreamingChatClient(url)
    rec = c.stream_chat(BODY, "m", request_id="rid-123")
    c.close()
    assert rec.ok, rec.error
    assert 0.100 <= rec.ttft_s < 0.100 + 0.150, rec.ttft_s
    assert len(rec.itl_s) == 3 and all(0.29 < g < 0.45 for g in rec.itl_s)
    assert fake.last().headers["x-request-id"] == "rid-123"


def test_role_and_keepalive_chunks_before_content_do_not_stop_the_clock(lt_fake):
    url, _ = lt_fake(ttft_ms=150, itl_ms=5, tokens=3)
    c = StreamingChatClient(url + "/v1")  # base URL with /v1 works too
    rec = c.stream_chat({**BODY, "fake": {"keepalive": 3}}, "m")
    c.close()
    assert rec.ok and rec.ttft_s >= 0.150, rec
    assert rec.content_chunks == 3


def test_usage_count_used_and_fallback_marked(lt_fake):
    url, _ = lt_fake(ttft_ms=1, itl_ms=1, tokens=3)
    c = StreamingChatClient(url)
    with_usage = c.stream_chat(BODY, "m")
    without = c.stream_chat({**BODY, "fake": {"fault": "no_usage"}}, "m")
    c.close()
    assert with_usage.tokens_source == "usage" and with_usage.completion_tokens == 3
    assert without.tokens_source == "chunks" and without.completion_tokens == 3


def test_http_errors_and_cut_streams_are_failures(lt_fake):
    url, _ = lt_fake(ttft_ms=1, itl_ms=1, tokens=5)
    c = StreamingChatClient(url)
    err = c.stream_chat({**BODY, "fake": {"fault": "503"}}, "m")
    cut = c.stream_chat({**BODY, "fake": {"fault": "cut"}}, "m")
    ok = c.stream_chat(BODY, "m")  # the connection pool recovers after a cut
    c.close()
    assert err.status == 503 and not err.ok and "503" in err.error
    assert not cut.ok and cut.error
    assert ok.ok
