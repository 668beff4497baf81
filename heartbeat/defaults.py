"""The heartbeat's defaults, apart from the process that beats (which loads the driver): the
command line's help shows them."""

from __future__ import annotations

DEFAULT_INTERVAL = 2.0  # seconds between beats
DEFAULT_SOURCE = "default"  # the heartbeat row's name
