"""Versions of the host: the distribution release and the plugin-facing API."""

__version__ = "0.1.0"

# The API plugins are written against. Plugins declare a range of it in their descriptor;
# bump the major version when a hookspec or an op protocol changes incompatibly.
HOST_API_VERSION = "1.0"
