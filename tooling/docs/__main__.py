"""``python -m tooling.docs [--check | --record-build]``: the entry point, run from the project's root."""

import sys
from pathlib import Path

from tooling.docs.generate import main

sys.exit(main(sys.argv[1:], Path.cwd()))
