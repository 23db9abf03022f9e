"""The benchmarks' tests use the load tests' loopback servers (fake upstream, gateway)."""
from tests.loadtests.conftest import ROOT, lt_fake, lt_gateway  # noqa: F401 (fixtures)
