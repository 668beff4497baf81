"""``python -m cache.tools.cli``: the `mtcache` command line."""

import sys

from cache.tools.cli.wiring import main

sys.exit(main())
