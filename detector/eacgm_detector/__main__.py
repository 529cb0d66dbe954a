"""``python -m eacgm_detector``: the same as ``otel-eacgm detector``."""

import sys

from eacgm_detector.cli import main

sys.exit(main(sys.argv[1:]))
