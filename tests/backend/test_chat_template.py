"""Chat templates rendered like transformers' apply_chat_template; errors are clear."""

from __future__ import annotations

import functools

import pytest

from backend.chat_template import ChatTemplateError, ChatTemplateMissing, render_chat_template
from backend.tokenizer import Tokenizer, byte_level_tokenizer
from backend.weights import embedded

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "Ünïcödé 🎉 and\nnewlines\n"}],
]


@functools.lru_cache(maxsize=1)
def _pair():
    transformers = pytest.importorskip("transformers")
    from backend.weights import load_model_source

    path = embedded.find_or_fetch()
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_model_source(embedded.EMBEDDED_NAME).tokenizer, ref


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_smollm2_template_matches_transformers(messages, gen):
    ours, ref = _pair()
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert ours.apply_chat_template(messages, add_generation_prompt=gen) == expected
    # and the prompt token ids agree too
    assert ours.encode(expected) == ref.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=gen, return_dict=False)


def test_content_parts_are_joined():
    tok = byte_level_tokenizer(512)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(parts) == tok.apply_chat_template(
        [{"role": "user", "content": "ab"}])
    with pytest.raises(ChatTemplateError, match="only text parts"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])


def test_missing_template_raises():
    base = byte_level_tokenizer(512)
    tok = Tokenizer(base.backend, base.meta.__class__(**{**base.meta.__dict__,
                                                         "chat_template": None}))
    with pytest.raises(ChatTemplateMissing, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_features_like_transformers():
    src = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
           "{% for m in messages %}{{ m | tojson }}{% if loop.last %}{% break %}{% endif %}"
           "{% endfor %}\n  {% if bos_token %}{{ bos_token }}{% endif %}"
           "{{ strftime_now('%Y') | length }}")
    out = render_chat_template(src, [{"role": "user", "content": "é"}],
                               special_tokens={"bos_token": "<s>"})
    # trim_blocks eats the newline after a block tag, lstrip_blocks the indent before one;
    # tojson keeps non-ASCII as is.
    assert out == '{"role": "user", "content": "é"}<s>4'
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    ref, _ = render_jinja_template([[{"role": "user", "content": "é"}]], chat_template=src,
                                   bos_token="<s>")
    assert ref == [out]
    with pytest.raises(ChatTemplateError, match="user first"):
        render_chat_template(src, [{"role": "system", "content": "x"}])


def test_sandbox_blocks_python_internals():
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}",
                             [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% set x = messages.append(1) %}", [])


# Templates in the style of real model families: Llama 3 (namespace, tools as JSON, a date),
# Mistral (role alternation enforced with raise_exception), Qwen2 (a default system prompt).
LLAMA3_STYLE = (
    "{{- bos_token }}{%- set ns = namespace(system='') %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set ns.system = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nToday Date: {{ strftime_now('%d %b %Y') }}\n"
    "{%- if tools is not none %}\n{%- for t in tools %}{{ t | tojson(indent=4) }}\n"
    "{%- endfor %}{%- endif %}\n{{ ns.system }}<|eot_id|>"
    "{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")
MISTRAL_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}")
QWEN2_STYLE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter ☀",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("template", [LLAMA3_STYLE, MISTRAL_STYLE, QWEN2_STYLE],
                         ids=["llama3", "mistral", "qwen2"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_family_templates_match_transformers(template, tools):
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    for messages in CONVERSATIONS:
        if template is MISTRAL_STYLE and messages[0]["role"] == "system":
            with pytest.raises(ChatTemplateError, match="roles must alternate"):
                render_chat_template(template, messages, special_tokens=specials, tools=tools)
            continue
        ours = render_chat_template(template, messages, special_tokens=specials, tools=tools)
        ref, _ = render_jinja_template([messages], chat_template=template, tools=tools,
                                       add_generation_prompt=True, **specials)
        assert ours == ref[0]


def test_namespace_refuses_underscore_attributes():
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% set ns = namespace(_x=1) %}{{ ns._x }}", [])
    out = render_chat_template("{% set ns = namespace(n=1) %}{% set ns.n = 2 %}{{ ns.n }}"
                               "{{ dict(a=1) | tojson }}", [])
    assert out == '2{"a": 1}'


def test_template_runtime_errors_become_template_errors():
    with pytest.raises(ChatTemplateError, match="cannot render these messages: TypeError"):
        render_chat_template(QWEN2_STYLE, [{"role": "user", "content": None}])
    with pytest.raises(ChatTemplateError, match="must be an object"):
        render_chat_template(QWEN2_STYLE, ["just a string"])


def test_broken_template_fails_chat_requests_not_the_load():
    base = byte_level_tokenizer(512)
    meta = base.meta.__class__(**{**base.meta.__dict__, "chat_template": "{% for x in %}"})
    tok = Tokenizer(base.backend, meta)  # loading still works: completions need no template
    with pytest.raises(ChatTemplateError, match="does not compile"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert tok.encode("x") == [ord("x")]
