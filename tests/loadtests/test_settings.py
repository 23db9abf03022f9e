"""Settings precedence (flag > config.toml [profiling] > default) and bad input."""
from argparse import Namespace

import pytest

from loadtests.settings import LoadSettings, read_profiling, resolve


def _opts(**kw):
    base = {f: None for f in LoadSettings.model_fields}
    base.update(kw)
    return Namespace(**base)


def test_flags_beat_the_config_file_which_beats_defaults(tmp_path, monkeypatch):
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


def test_bad_values_name_the_flag_or_the_dotted_key(tmp_path):
    with pytest.raises(ValueError, match="--output-tokens"):
        resolve(_opts(output_tokens="0"))
    with pytest.raises(ValueError, match="--rate"):
        resolve(_opts(rate="nan", arrival="poisson"))
    with pytest.raises(ValueError, match="--endpoint"):
        resolve(_opts(endpoint="embeddings"))
    with pytest.raises(ValueError, match="--ignore-eos"):
        resolve(_opts(ignore_eos="perhaps"))
    assert resolve(_opts(ignore_eos="false")).ignore_eos is False
    cfg = tmp_path / "c.toml"
    cfg.write_text("[profiling]\nmeasure_runs = \"many\"\n")
    with pytest.raises(ValueError, match=r"profiling\.measure_runs"):
        read_profiling(str(cfg))
    cfg.write_text("profiling = 3\n")
    with pytest.raises(ValueError, match="profiling"):
        read_profiling(str(cfg))
