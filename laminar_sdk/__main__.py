"""``python -m laminar_sdk`` runs the ``laminar`` command."""

from laminar_sdk._cli.main import main

raise SystemExit(main())
