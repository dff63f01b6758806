"""`python -m beam_pipeline ...` runs the same CLI as the `img2tfrecord` script."""

from beam_pipeline.main import cli

if __name__ == "__main__":
    cli()
