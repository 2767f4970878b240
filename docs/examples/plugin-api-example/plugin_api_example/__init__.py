"""plugin-api-example: the worked example of docs/writing-a-plugin.md (backend id ``example``)."""
