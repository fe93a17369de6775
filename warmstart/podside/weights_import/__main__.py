"""`python3 weights_import.pyz`: the zip's root __main__ runs this module (warmstart/manifests/pod_scripts.py)."""

import sys

from .main import main

sys.exit(main(sys.argv[1:]))
