"""`python -m gpufill ...`: the same command line as `gpufill ...` (useful where no console script is installed)."""

from gpufill.cli import main

main()
