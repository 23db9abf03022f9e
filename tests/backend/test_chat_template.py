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
