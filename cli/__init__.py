"""The `faultline` command line: the composition root (top layer; nothing imports it)."""
