"""Load-test settings: Locust custom arguments and the ``[profiling]`` section of config.toml.

Precedence: a flag given on the command line (or in the web UI) > ``[profiling]`` in the file
named by Locust's own ``--config`` > the defaults below.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from typing import Any

ARRIVALS = ("closed", "constant", "poisson")

# config.toml [profiling] key -> LoadSettings field
_PROFILING_KEYS = {"warmup_runs": "warmup_requests", "measure_runs": "measure_requests",
                   "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}
# keys a [profiling] section may carry that this tool does not use (accepted, ignored)
_PROFILING_IGNORED = {"enable_nvtx", "nvtx_range_prefix"}


@dataclass(frozen=True)
class LoadSettings:
    model: str = "smollm2"
    prompt_tokens: int = 512
    output_tokens: int = 256
    api_key: str | None = None
    records: str = "runs/records.jsonl"
    warmup_requests: int = 5
    measure_requests: int = 0          # 0 = no limit (stop by --run-time)
    arrival: str = "closed"
    rate: float = 0.0                  # open loop: requests/s over all workers
    prompts_file: str | None = None
    tokenizer: str | None = None       # a tokenizer.json to use instead of POST /tokenize
    tokenize_url: str | None = None    # default: the host's /tokenize
    endpoint: str = "chat"             # chat | completions
    ignore_eos: bool = True
    request_timeout: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"--arrival must be one of {ARRIVALS}, not {self.arrival!r}")
        if self.arrival != "closed" and self.rate <= 0:
            raise ValueError(f"--arrival {self.arrival} needs --rate > 0 (requests/s)")
        if self.prompt_tokens < 0 or self.output_tokens < 1:
            raise ValueError("--prompt-tokens must be >= 0 and --output-tokens >= 1")
        if self.warmup_requests < 0 or self.measure_requests < 0:
            raise ValueError("--warmup-requests and --measure-requests must be >= 0")
        if self.endpoint not in ("chat", "completions"):
            raise ValueError("--endpoint must be chat or completions")


def read_profiling(path: str) -> dict[str, int]:
    """The ``[profiling]`` section of a config.toml, as LoadSettings fields.

    Unknown keys are rejected with a message naming them (a typo must not silently fall back
    to a default).
    """
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    section = doc.get("profiling", {})
    if not isinstance(section, dict):
        raise ValueError(f"{path}: [profiling] must be a table")
    unknown = sorted(set(section) - set(_PROFILING_KEYS) - _PROFILING_IGNORED)
    if unknown:
        raise ValueError(f"{path}: unknown [profiling] keys: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_PROFILING_KEYS))})")
    return {_PROFILING_KEYS[k]: int(v) for k, v in section.items() if k in _PROFILING_KEYS}


def add_arguments(parser: Any) -> None:
    """Locust custom arguments (shown in the web UI). Defaults of None mean "not given"."""
    g = parser  # (argument groups drop Locust's web-UI options such as is_secret)
    g.add_argument("--model", default=None, help="model name/alias sent in requests "
                   "(default smollm2)")
    g.add_argument("--prompt-tokens", type=int, default=None,
                   help="exact prompt length in tokens (default 512; 0 = prompts as given)")
    g.add_argument("--output-tokens", type=int, default=None,
                   help="output length forced with max_tokens + min_tokens + ignore_eos "
                   "(default 256)")
    # default None, read from the env at run time: the key never lands in the web UI's page
    g.add_argument("--api-key", default=None, is_secret=True,
                   help="bearer key (default: env GATEWAY_API_KEY)")
    g.add_argument("--records", default=None,
                   help="raw per-request JSONL (default runs/records.jsonl); a summary goes "
                   "to PATH with .summary.json")
    g.add_argument("--warmup-requests", type=int, default=None,
                   help="requests per load-generator process excluded as warm-up (default 5)")
    g.add_argument("--measure-requests", type=int, default=None,
                   help="stop after this many measured requests (default 0 = run time)")
    g.add_argument("--arrival", default=None, choices=ARRIVALS,
                   help="closed: users send back to back; constant/poisson: open loop at --rate")
    g.add_argument("--rate", type=float, default=None, help="open loop: requests/s in total")
    g.add_argument("--prompts-file", default=None,
                   help="JSONL of real prompts ({\"prompt\": ...} or {\"messages\": [...]})")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer.json for prompt lengths instead of the server's /tokenize")
    g.add_argument("--tokenize-url", default=None,
                   help="POST /tokenize URL (default: HOST/tokenize; the backend's when the "
                   "host is a gateway without one)")
    g.add_argument("--endpoint", default=None, choices=("chat", "completions"))
    g.add_argument("--ignore-eos", default=None, choices=("true", "false"),
                   help="send ignore_eos/min_tokens to force the output length (default true)")
    g.add_argument("--request-timeout", type=float, default=None,
                   help="seconds without a byte before a request fails (default 600)")
    g.add_argument("--seed", type=int, default=None, help="prompt/arrival RNG seed")


def resolve(options: Any) -> LoadSettings:
    """LoadSettings from Locust's parsed options (flags > config.toml [profiling] > defaults)."""
    values: dict[str, Any] = {}
    config_path = getattr(options, "config", None)
    if config_path and str(config_path).endswith(".toml"):
        values.update(read_profiling(config_path))
    for f in fields(LoadSettings):
        given = getattr(options, f.name, None)
        if given is not None and given != "":  # the web UI sends "" for an empty field
            values[f.name] = given
    values.setdefault("api_key", os.environ.get("GATEWAY_API_KEY") or None)
    return LoadSettings(**{k: _coerce(k, v) for k, v in values.items()})


def _coerce(name: str, value: Any) -> Any:
    """Values from the web UI form arrive as strings; cast them to the field's type."""
    default = LoadSettings.__dataclass_fields__[name].default
    if isinstance(default, bool):
        return value if isinstance(value, bool) else str(value).lower() in ("true", "1", "yes")
    if isinstance(default, (int, float)) and not isinstance(value, (int, float)):
        return type(default)(value)
    return value


def write_back(options: Any, settings: LoadSettings) -> None:
    """Put resolved values into the parsed options, so Locust ships them to the workers."""
    for f in fields(LoadSettings):
        value = getattr(settings, f.name)
        setattr(options, f.name, ("true" if value else "false") if f.name == "ignore_eos"
                else value)
