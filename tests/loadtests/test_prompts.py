"""Prompts of exact token length through POST /tokenize (the fake counts whitespace words; the
real backend on a synthetic model counts bytes)."""
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

import pytest

from loadtests.procs import free_port, stop_process
from loadtests.prompts import INSTRUCTION, PromptFactory, ServerTokenCounter, load_prompts_file

from .conftest import ROOT


def test_synthetic_prompts_have_the_exact_length_and_differ(lt_fake):
    url, _ = lt_fake()
    counter = ServerTokenCounter(url + "/tokenize", "m")
    f = PromptFactory(counter, 40, chat=True, seed=1)
    a, b = f.next_prompt(), f.next_prompt()
    assert counter.count_text(a) == counter.count_text(b) == 40 - f.template_overhead
    assert a != b and f.exact
    counter.close()


def test_file_prompts_cut_and_padded(lt_fake, tmp_path):
    url, _ = lt_fake()
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"prompt": "' + " ".join(["word"] * 50) + '"}\n'
                 '{"messages": [{"role": "user", "content": "short one"}]}\n')
    texts = load_prompts_file(str(p))
    counter = ServerTokenCounter(url + "/tokenize", "m")
    f = PromptFactory(counter, 12, chat=False, texts=texts)
    assert f.exact
    assert {counter.count_text(f.next_prompt()) for _ in range(10)} == {12}
    counter.close()


@pytest.fixture(scope="module")
def byte_level_backend(tmp_path_factory) -> Iterator[str]:
    """The real backend on a synthetic model: its tokenizer is byte-level (a word costs one
    token per byte plus its space), so no common word is one token."""
    port = free_port()
    log = tmp_path_factory.mktemp("backend") / "backend.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "backend", "--model", "synthetic:tiny",
                                 "--port", str(port), "--kv-cache-memory", "0.05"], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "backend not healthy in 120 s"
                time.sleep(0.3)
        yield url
    finally:
        stop_process(proc)


@pytest.mark.parametrize("tokens", [512, 96, 30])
def test_byte_level_prompts_are_exact_and_differ_early(byte_level_backend, tokens):
    counter = ServerTokenCounter(byte_level_backend + "/tokenize", "synthetic:tiny")
    f = PromptFactory(counter, tokens, chat=True, seed=2)
    prompts = [f.next_prompt() for _ in range(8)]
    assert f.exact
    assert {counter.count_messages([{"role": "user", "content": p}]) for p in prompts} == {tokens}
    # distinct within the first 16-token KV block after the shared instruction (at 30 tokens
    # there is no room for the instruction): a prefix cache shares at most the instruction
    head = len(INSTRUCTION) if prompts[0].startswith(INSTRUCTION) else 0
    assert head or tokens < 64
    assert len({p[:head + 16] for p in prompts}) == len(prompts)
    counter.close()
