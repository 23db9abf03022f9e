"""OpenAI-compatible HTTP server over the engine (``python -m backend``)."""
from .app import create_app, serve, start_app
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app", "serve", "start_app"]
