"""``python -m experiments.chaos``: the checker's command line (`experiments.chaos.driver`)."""

from __future__ import annotations

from experiments.chaos.driver import main

raise SystemExit(main())
