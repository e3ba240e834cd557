"""``python -m agentrl`` runs the ``agentrl`` command (the same as the console script)."""

from agentrl.cli import main

raise SystemExit(main())
