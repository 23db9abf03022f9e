"""firsttoken loadtests."""
