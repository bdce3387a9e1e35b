"""`python -m autoshard.cli ...` runs the same command line as the `autoshard` console script."""

from autoshard.cli import main

main()
