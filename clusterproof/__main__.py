"""``python -m clusterproof``: the same as the ``clusterproof`` command."""
import sys

from clusterproof.cli import main

sys.exit(main())
