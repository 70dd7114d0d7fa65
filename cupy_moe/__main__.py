"""``python -m cupy_moe``: the ``cupy-moe`` command."""

import sys

from cupy_moe.harness.cli import main

sys.exit(main())
