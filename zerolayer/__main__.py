"""``python -m zerolayer``: the ``zerolayer`` command."""

import sys

from zerolayer.cli.main import main

sys.exit(main())
