"""The inference engine: scheduler, paged KV cache, model runner, async bridge.

Import names from their own modules (``backend.engine.config``,
``backend.engine.async_engine`` ...): importing the package itself stays cheap (no torch).
"""
