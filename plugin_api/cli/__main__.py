"""``python -m plugin_api.cli``: the same as ``plugin-api``."""

import sys

from . import main

sys.exit(main())
