"""``python -m tfhvd.timeline``: the ``tfhvd-timeline`` command."""

import sys

from tfhvd.timeline.cli import main

sys.exit(main())
