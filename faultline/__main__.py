"""`python -m faultline`: the same entry point as the `faultline` console script (the CLI package)."""

from cli.main import main

main()
