"""Settings precedence (flag > config.toml [profiling] > default) and bad input."""
from argparse import Namespace

import pytest

from loadtests.settings import LoadSettings, read_profiling, resolve


def _opts(**kw):
    base = {f: None for f in LoadSettings.__dataclass_fields__}
    base.update(kw)
    return Namespace(**base)


def test_flags_beat_the_article_config_which_beats_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_API_KEY", "sk-from-env")
    cfg = tmp_path / "config.toml"
    cfg.write_text("[profiling]\nwarmup_runs = 5\nmeasure_runs = 20\nprompt_tokens = 512\n"
                   "output_tokens = 256\nenable_nvtx = true\n")
    s = resolve(_opts(config=str(cfg), output_tokens="64", rate="2.5", arrival="poisson"))
    assert (s.warmup_requests, s.measure_requests, s.prompt_tokens) == (5, 20, 512)
    assert s.output_tokens == 64 and s.rate == 2.5  # web-UI strings are cast
    assert s.api_key == "sk-from-env" and s.model == "smollm2"


def test_unknown_profiling_key_is_named(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[profiling]\nwarmup_run = 5\n")
    with pytest.raises(ValueError, match="warmup_run"):
        read_profiling(str(cfg))


def test_open_loop_needs_a_rate():
    with pytest.raises(ValueError, match="--rate"):
        resolve(_opts(arrival="constant"))
