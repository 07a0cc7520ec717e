"""``python -m cloudrl`` runs the CLI (used by ``ray job submit``)."""

import sys

from cloudrl.cli import main

sys.exit(main())
