"""Load-test settings: Locust custom arguments and the ``[profiling]`` section of config.toml.

Precedence: a flag given on the command line (or in the web UI) > ``[profiling]`` in the file
named by Locust's own ``--config`` > the defaults below.
"""
from __future__ import annotations

import os
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ARRIVALS = ("closed", "constant", "poisson")

# config.toml [profiling] key -> LoadSettings field
_PROFILING_KEYS = {"warmup_runs": "warmup_requests", "measure_runs": "measure_requests",
                   "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}


class LoadSettings(BaseModel):
    """One load test's settings. Values from the web UI arrive as strings; pydantic's lax
    mode casts them ("64" -> 64, "false" -> False) and rejects what does not fit."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "smollm2"
    prompt_tokens: int = Field(512, ge=0)
    output_tokens: int = Field(256, ge=1)
    api_key: str | None = None
    records: str = "runs/records.jsonl"
    warmup_requests: int = Field(5, ge=0)
    measure_requests: int = Field(0, ge=0)  # 0 = no limit (stop by --run-time)
    arrival: Literal["closed", "constant", "poisson"] = "closed"
    rate: float = Field(0.0, ge=0, allow_inf_nan=False)  # open loop: requests/s, all workers
    prompts_file: str | None = None
    tokenizer: str | None = None       # a tokenizer.json to use instead of POST /tokenize
    tokenize_url: str | None = None    # default: the host's /tokenize
    endpoint: Literal["chat", "completions"] = "chat"
    ignore_eos: bool = True
    request_timeout: float = Field(600.0, gt=0, allow_inf_nan=False)
    seed: int = 0

    @model_validator(mode="after")
    def _open_loop_has_a_rate(self) -> "LoadSettings":
        if self.arrival != "closed" and self.rate <= 0:
            raise ValueError(f"--arrival {self.arrival} needs --rate > 0 (requests/s)")
        return self


class ProfilingSection(BaseModel):
    """``[profiling]`` of config.toml; ``enable_nvtx`` and ``nvtx_range_prefix`` belong to the
    inference service and are accepted here without effect."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_runs: int | None = Field(None, ge=0)
    measure_runs: int | None = Field(None, ge=0)
    prompt_tokens: int | None = Field(None, ge=0)
    output_tokens: int | None = Field(None, ge=1)
    enable_nvtx: bool | None = None
    nvtx_range_prefix: str | None = None


def _flag(loc: tuple[Any, ...]) -> str:
    return "--" + str(loc[0]).replace("_", "-") if loc else "settings"


def _message(exc: ValidationError, where: Any) -> str:
    """One line per problem, each naming where it is (a flag, or the dotted key of a file)."""
    return "; ".join(f"{where(e['loc'])}: {e['msg']}" for e in exc.errors())


def read_profiling(path: str) -> dict[str, int]:
    """The ``[profiling]`` section of a config.toml, as LoadSettings fields.

    Unknown keys are rejected with a message naming them (a typo must not silently fall back
    to a default).
    """
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    try:
        section = ProfilingSection.model_validate(doc.get("profiling", {}))
    except ValidationError as exc:
        raise ValueError(f"{path}: " + _message(
            exc, lambda loc: ".".join(map(str, ("profiling", *loc))))) from None
    return {field: getattr(section, key) for key, field in _PROFILING_KEYS.items()
            if getattr(section, key) is not None}


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
    for name in LoadSettings.model_fields:
        given = getattr(options, name, None)
        if given is not None and given != "":  # the web UI sends "" for an empty field
            values[name] = given
    values.setdefault("api_key", os.environ.get("GATEWAY_API_KEY") or None)
    try:
        return LoadSettings(**values)
    except ValidationError as exc:
        raise ValueError(_message(exc, _flag)) from None


def write_back(options: Any, settings: LoadSettings) -> None:
    """Put resolved values into the parsed options, so Locust ships them to the workers."""
    for name in LoadSettings.model_fields:
        value = getattr(settings, name)
        setattr(options, name, ("true" if value else "false") if name == "ignore_eos"
                else value)
