"""``python -m compiler`` == ``tvmpipe``."""

import sys

from .cli import main

sys.exit(main())
