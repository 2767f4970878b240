"""``python -m ci.images``: see ``ci.images.cli``."""

import sys

from .cli import main

sys.exit(main())
