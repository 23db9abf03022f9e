"""The inference engine: scheduler, paged KV cache, model runner, async bridge.

Public names are re-exported lazily by their modules; import them from their own modules
(``backend.engine.config``, ``backend.engine.async_engine`` ...) so importing the package
stays cheap (no torch import at package import time).
"""
