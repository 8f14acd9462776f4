"""``python -m tools.gpu_check``: the check's entry point (see the package's docstring)."""

import sys

from tools.gpu_check.cli import main

sys.exit(main())
