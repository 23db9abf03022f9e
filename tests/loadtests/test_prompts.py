"""Prompts of exact token length through POST /tokenize (the fake counts whitespace words)."""
from loadtests.prompts import PromptFactory, ServerTokenCounter, load_prompts_file


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
