"""``python -m tfhvd.runner``: the same as ``tfhvdrun``."""

import sys

from tfhvd.runner.launch import main

if __name__ == "__main__":
    sys.exit(main())
