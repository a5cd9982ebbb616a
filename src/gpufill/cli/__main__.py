"""`python -m gpufill.cli ...` (torchrun relaunches `gpufill train --nproc` this way)."""

from gpufill.cli import main

main()
