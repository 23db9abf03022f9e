"""Server configuration: one frozen pydantic model; unknown keys and bad values are rejected
naming their dotted path (``engine.block_size``)."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from backend.engine.config import EngineConfig
from backend.schema import Schema

DEFAULT_MODEL = "smollm2-135m-instruct"
PROFILE_TOKEN_ENV = "BACKEND_PROFILE_TOKEN"  # bearer token of POST /debug/profile


class ServerConfig(Schema):
    model: str = DEFAULT_MODEL  # name or path handed to load_model_source
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    served_model_name: str | None = None  # id shown by /v1/models; None = the source's name
    engine: EngineConfig = EngineConfig()
    # Chat requests without max_tokens may generate up to the context end (OpenAI semantics);
    # completions default to 16 tokens like OpenAI's legacy endpoint.
    default_completion_max_tokens: int = Field(16, ge=1)
    # POST /debug/profile (token from PROFILE_TOKEN_ENV) and where its traces are stored
    enable_profiling: bool = False
    profile_dir: str = "runs/profiles"
    # Slow clients: a request head must arrive within header_timeout_s, its body within
    # body_timeout_s; an idle keep-alive connection closes after keepalive_timeout_s; past
    # max_connections open sockets a new one gets a 503 and is closed.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    keepalive_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(2048, ge=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ServerConfig":
        return cls.model_validate(data)
