"""`python3 engine_host.pyz [args]` or `python3 -m warmstart.podside.engine_host [args]`."""

import sys

from .main import main

sys.exit(main())
