"""The conformance kit: one pytest suite that any backend runs on its own hardware.

``pytest --plugin-api-backend=<id>`` (the pytest plugin in ``plugin.py`` is registered through
the ``pytest11`` entry point) or ``plugin-api check``.
"""
