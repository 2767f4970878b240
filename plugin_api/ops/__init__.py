"""The four op families (contract, validation, host entry points) and what they share."""
