"""A fast, fault-injecting fake OpenAI-compatible upstream for tests and benchmarks.

``python -m fakeupstream`` serves it; ``FakeUpstream(config)`` runs it in an event loop and
``run_in_thread(config)`` on a thread of its own. The options and faults are listed in
``fakeupstream/server.py``.
"""
from fakeupstream.plan import FakeConfig, Received, Stats
from fakeupstream.server import FakeUpstream
from fakeupstream.thread import run_in_thread

__all__ = ["FakeConfig", "FakeUpstream", "Received", "Stats", "run_in_thread"]
