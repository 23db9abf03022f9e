"""Server configuration: one frozen dataclass; unknown keys are rejected by name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backend.configutil import check_keys
from backend.engine.config import EngineConfig

DEFAULT_MODEL = "smollm2-135m-instruct"
PROFILE_TOKEN_ENV = "BACKEND_PROFILE_TOKEN"  # bearer token of POST /debug/profile


@dataclass(frozen=True)
class ServerConfig:
    model: str = DEFAULT_MODEL  # name or path handed to load_model_source
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # id shown by /v1/models; None = the source's name
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Chat requests without max_tokens may generate up to the context end (OpenAI semantics);
    # completions default to 16 tokens like OpenAI's legacy endpoint.
    default_completion_max_tokens: int = 16
    # POST /debug/profile (token from PROFILE_TOKEN_ENV) and where its traces are stored
    enable_profiling: bool = False
    profile_dir: str = "runs/profiles"
    # Slow clients: a request head must arrive within header_timeout_s, its body within
    # body_timeout_s; an idle keep-alive connection closes after keepalive_timeout_s; past
    # max_connections open sockets a new one gets a 503 and is closed.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 30.0
    max_connections: int = 2048

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.default_completion_max_tokens < 1:
            raise ValueError("default_completion_max_tokens must be >= 1")
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ServerConfig":
        check_keys(cls, data)
        data = dict(data)
        if isinstance(data.get("engine"), dict):
            data["engine"] = EngineConfig.from_dict(data["engine"])
        return cls(**data)
