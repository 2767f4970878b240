"""CI tooling of plugin-api. ``ci.images``: content-addressed reuse of the plugin base images."""
