"""``python -m trio_responses`` is the ``trio-responses`` command."""

import sys

from .cli import main

sys.exit(main())
