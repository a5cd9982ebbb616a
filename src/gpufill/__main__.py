"""The `gpufill` command (`python -m gpufill ...` too): a command that trains starts its workers' zygote first
(campaign/worker/early.py), so torch's import there overlaps the command line's own imports."""

import sys


def main() -> None:
    from gpufill.campaign.worker import early

    early.start(sys.argv[1:])
    from gpufill.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
