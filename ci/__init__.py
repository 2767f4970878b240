"""CI tooling of plugin-api. ``ci.images``: content-addressed reuse of the plugin base images;
``ci.pins``: are the image digests pinned in the docs still what their tags read;
``ci.docblocks``: the fenced and pins blocks of the docs (shared with ``docs/checks.py``)."""
