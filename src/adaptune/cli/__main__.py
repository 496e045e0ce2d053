"""``python -m adaptune.cli``."""
import sys

from . import main

sys.exit(main())
