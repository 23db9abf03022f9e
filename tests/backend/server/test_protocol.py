"""The request schemas: each bad value is a 400 whose param is the field's dotted path; the
bodies the openai SDK and common clients send today still pass; an unknown field is refused
the way OpenAI refuses it."""
from __future__ import annotations

import openai
import pytest

from backend.server.errors import APIError
from backend.server.protocol import parse_generation, parse_messages

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
# Every field the openai SDK's create() takes, set the way a caller would set it, plus
# vLLM's sampling extras: all of them were accepted before the schemas and still are.
SDK_CHAT = {
    **CHAT, "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text",
                                                                        "text": "kind."}]},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": None, "refusal": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "user", "content": "and?"}],
    "frequency_penalty": 0.5, "presence_penalty": -0.5, "logit_bias": {"50256": -100},
    "logprobs": False, "top_logprobs": 0, "max_tokens": 5, "max_completion_tokens": 4,
    "metadata": {"team": "a"}, "n": 1, "seed": -3, "stop": ["\n"], "store": False,
    "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0,
    "top_p": 0.5, "user": "u-1", "tool_choice": "none", "parallel_tool_calls": False,
    "response_format": {"type": "text"}, "service_tier": "auto", "reasoning_effort": "low",
    "verbosity": "low", "modalities": ["text"], "prompt_cache_key": "k",
    "safety_identifier": "s", "tools": [], "functions": None, "function_call": None,
    "audio": None, "prediction": None, "web_search_options": None,
    "top_k": -1, "min_tokens": 1, "ignore_eos": True, "stop_token_ids": [0, 7]}
SDK_COMPLETION = {
    **COMPLETION, "best_of": 1, "echo": False, "frequency_penalty": 0, "presence_penalty": 0,
    "logit_bias": None, "logprobs": 0, "max_tokens": 16, "n": 1, "seed": 2**63 - 1,
    "stop": "x", "stream": False, "stream_options": None, "suffix": None, "temperature": 2,
    "top_p": 1, "user": "u", "top_k": 40, "min_tokens": 0, "ignore_eos": False,
    "stop_token_ids": []}


def _rejects(body: dict, kind: str = "chat") -> dict:
    with pytest.raises(APIError) as err:
        parse_generation(body, kind)
    assert err.value.status == 400
    return err.value.body()["error"]


def test_todays_bodies_still_pass():
    chat = parse_generation(SDK_CHAT, "chat")
    assert chat.messages == ({"role": "developer", "content": "Be brief."},
                             {"role": "system", "content": "Be kind."},
                             {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": ""},
                             {"role": "tool", "content": "42"},
                             {"role": "user", "content": "and?"})
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.top_k, chat.seed,
            chat.min_tokens, chat.ignore_eos, chat.stop, chat.stop_token_ids, chat.stream,
            chat.include_usage) == (4, 0.0, 0.5, 0, -3, 1, True, ("\n",), (0, 7), True, True)
    done = parse_generation(SDK_COMPLETION, "completion")
    assert (done.prompt, done.prompt_token_ids, done.stop, done.top_k, done.max_tokens,
            done.temperature) == ("hi", None, ("x",), 40, 16, 2.0)
    ids = parse_generation({**COMPLETION, "prompt": [1, 2, 3]}, "completion")
    assert ids.prompt is None and ids.prompt_token_ids == (1, 2, 3)
    # null is the default, as before
    plain = parse_generation({**CHAT, "temperature": None, "stop": None, "seed": None}, "chat")
    assert (plain.temperature, plain.stop, plain.seed, plain.max_tokens) == (1.0, (), None, None)


@pytest.mark.parametrize("kind,body,param,code", [
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "x"},
                                   {"role": "user", "content": 5}]},
     "messages.1.content", "invalid_type"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages.0.content.0.text", "invalid_type"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content.0.type", "invalid_value"),
    ("chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role",
     "invalid_value"),
    ("chat", {**CHAT, "messages": [{"content": "x"}]}, "messages.0.role",
     "missing_required_parameter"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "x", "mood": 1}]},
     "messages.0.mood", "unknown_parameter"),
    ("chat", {**CHAT, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "invalid_type"),
    ("chat", {**CHAT, "stop_token_ids": [1, 2**31]}, "stop_token_ids.1", "invalid_value"),
    ("chat", {**CHAT, "max_tokens": True}, "max_tokens", "invalid_type"),
    ("chat", {**CHAT, "max_tokens": 2.0}, "max_tokens", "invalid_type"),
    ("chat", {**CHAT, "temperature": "0.5"}, "temperature", "invalid_type"),
    ("chat", {**CHAT, "temperature": 2.5}, "temperature", "invalid_value"),
    ("chat", {**CHAT, "top_k": -2}, "top_k", "invalid_value"),
    ("chat", {**CHAT, "seed": 1.5}, "seed", "invalid_type"),
    ("chat", {**CHAT, "presence_penalty": 2.1}, "presence_penalty", "invalid_value"),
    ("chat", {**CHAT, "min_tokens": 5, "max_tokens": 4}, "min_tokens", "invalid_value"),
    ("chat", {**CHAT, "stop": ["a", ""]}, "stop", "invalid_value"),
    ("chat", {**CHAT, "stop": ["s"] * 65}, "stop", "invalid_value"),
    ("chat", {**CHAT, "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ("chat", {**CHAT, "logprobs": True}, "logprobs", "unsupported_parameter"),
    ("chat", {**CHAT, "model": "m" * 257}, "model", "invalid_value"),
    ("completion", {**COMPLETION, "prompt": [1, True]}, "prompt", "invalid_type"),
    ("completion", {**COMPLETION, "echo": True}, "echo", "unsupported_parameter"),
    ("completion", {**COMPLETION, "best_of": 2}, "best_of", "unsupported_parameter"),
    ("completion", {**COMPLETION, "suffix": "end"}, "suffix", "unsupported_parameter"),
    ("completion", {**COMPLETION, "messages": CHAT["messages"]}, "messages",
     "unknown_parameter"),
])
def test_a_bad_value_is_named_by_its_dotted_path(kind, body, param, code):
    error = _rejects(body, kind)
    assert (error["param"], error["code"]) == (param, code), error
    assert param in error["message"]


def test_unknown_field_is_refused_like_openai():
    error = _rejects({**CHAT, "repetition_penalty": 1.1})
    assert error["message"] == "Unrecognized request argument supplied: repetition_penalty"
    assert error["param"] == "repetition_penalty"


def test_errors_never_echo_a_huge_value_or_key():
    error = _rejects({**CHAT, "k" * 100_000: 1})
    assert len(error["message"]) < 300 and len(error["param"]) < 200
    error = _rejects({**CHAT, "temperature": "t" * 100_000})
    assert len(error["message"]) < 300 and error["param"] == "temperature"


def test_tokenize_messages_use_the_same_schema():
    assert parse_messages({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}) == (
        {"role": "user", "content": "ab"},)
    for body, param in (({}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"role": "user", "content": {}}]}, "messages.0.content")):
        with pytest.raises(APIError) as err:
            parse_messages(body)
        assert err.value.param == param


async def test_the_sdk_with_its_optional_fields_against_the_server(fake, sdk_client):
    client = sdk_client(f"{fake.base_url}/v1")
    resp = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        user="u", metadata={"k": "v"}, store=False, logit_bias={"1": 0},
        presence_penalty=0.1, frequency_penalty=0.1, seed=1, n=1, parallel_tool_calls=False,
        response_format={"type": "text"}, service_tier="auto")
    assert resp.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}],
            extra_body={"guided_json": {}})
    assert err.value.body["param"] == "guided_json"
    assert err.value.body["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as err:
        await client.completions.create(model="fake-model", prompt="x", echo=True)
    assert err.value.body["param"] == "echo"
