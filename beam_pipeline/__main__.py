"""The console entry: `img2tfrecord ...` and `python -m beam_pipeline ...`."""

import sys

from beam_pipeline.cli import startup  # no Beam import


def cli() -> None:
    """The process set up for the CLI (cli/startup.py), then the CLI itself (main.cli)."""
    startup.prepare(sys.argv[1:])
    from beam_pipeline import main

    try:
        main.cli()
    finally:
        startup.before_exit()


if __name__ == "__main__":
    cli()
