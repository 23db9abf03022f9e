"""Client keys: held only as sha256 digests, checked in constant time, with model allow-lists."""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from typing import Mapping

from aiohttp import web

from gateway.config import KeyConfig
from gateway.errors import Forbidden, Unauthorized

log = logging.getLogger("gateway.auth")


@dataclass(frozen=True)
class ClientKey:
    name: str
    digest: bytes                 # sha256 of the key; the plaintext is never kept
    models: tuple[str, ...]

    def allows(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


class KeyStore:
    """All client keys; :meth:`check` compares against every key so timing reveals nothing."""

    def __init__(self, keys: tuple[ClientKey, ...]) -> None:
        self.keys = keys

    @classmethod
    def from_config(cls, configs: tuple[KeyConfig, ...], env: Mapping[str, str]) -> "KeyStore":
        keys = []
        for k in configs:
            if k.sha256 is not None:
                keys.append(ClientKey(k.name, bytes.fromhex(k.sha256), k.models))
            elif env.get(k.env or ""):
                keys.append(ClientKey(k.name, digest(env[k.env or ""]), k.models))
            else:
                # Still start: the operator sees why every request with this key gets 401.
                log.warning("client key %r disabled: environment variable %s is not set",
                            k.name, k.env)
        return cls(tuple(keys))

    def check(self, presented: str | None) -> ClientKey:
        if not presented:
            raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
        d = digest(presented)
        found: ClientKey | None = None
        for key in self.keys:  # no early exit: same work whichever key matches
            if hmac.compare_digest(d, key.digest):
                found = key
        if found is None:
            raise Unauthorized("Invalid API key.")
        return found


MAX_KEY_CHARS = 1024
# Printable ASCII without space: what API keys are made of. Anything else (control bytes,
# bytes that are not UTF-8, which aiohttp hands over as surrogates) is refused unseen.
_KEY_RE = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_KEY_CHARS)


def presented_key(request: web.Request) -> str | None:
    """The client's key from ``Authorization: Bearer`` (or ``x-api-key``/``api-key``).

    A malformed key is a 401 whose message never quotes it."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        key: str | None = auth[7:].strip()
    else:
        key = request.headers.get("x-api-key") or request.headers.get("api-key")
    if key and not _KEY_RE.fullmatch(key):
        raise Unauthorized("Malformed API key: a key is printable ASCII without spaces, at "
                           f"most {MAX_KEY_CHARS} characters.", code="malformed_api_key")
    return key


def require_model(key: ClientKey, model: str) -> None:
    if not key.allows(model):
        raise Forbidden(f"Key {key.name!r} may not use model {model!r}.", param="model")
