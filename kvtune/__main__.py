"""``python -m kvtune``: the ``kvtune`` command."""

import sys

from kvtune.optimizer.cli import main

if __name__ == "__main__":
    sys.exit(main())
