"""``python -m trio_responses`` is the ``trio-responses`` command."""

import sys

from .cli import main

# Guarded: the vLLM engine spawns processes, which import the main module again.
if __name__ == "__main__":
    sys.exit(main())
