"""firsttoken gateway."""
