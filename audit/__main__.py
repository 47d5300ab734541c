"""`python -m audit` and the `audit` program.

The workers a `check --jobs N` line asks for are started first, so that their imports run
beside this process's (`audit.flows.workers.start_for_command_line`); then the command line runs.
"""

import sys


def main() -> None:
    """Run the `audit` command line."""
    from audit.flows.workers import start_for_command_line

    start_for_command_line(sys.argv[1:])
    from audit.cli import main as run

    run()


if __name__ == "__main__":
    main()
