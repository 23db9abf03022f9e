"""firsttoken backend."""
