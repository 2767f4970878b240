"""``python -m ci.pins``: see ``ci.pins.cli``."""

import sys

from .cli import main

sys.exit(main())
