"""`python -m beam_pipeline ...` runs the same CLI as the `img2tfrecord` script."""

import sys

from beam_pipeline.main import main

if __name__ == "__main__":
    sys.exit(main())
