"""``python -m backend --model NAME_OR_PATH ...`` (see backend/cli.py and docs/BACKEND.md)."""
import sys

from backend.cli import main

sys.exit(main())
