"""``python -m laminar_conformance run CONNECTOR ...``: the kit's command without ``laminar``."""

from __future__ import annotations

import sys

from laminar_conformance._cli import main

sys.exit(main())
