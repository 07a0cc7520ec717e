"""``python -m cloudrl.labelling serve|operators|enqueue|...``: ``cloudrl label`` alone."""

import sys

from cloudrl.labelling.cli import main

sys.exit(main())
