"""``python -m raftlet``: the same as the ``raftlet`` console script."""

import sys

from raftlet.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
