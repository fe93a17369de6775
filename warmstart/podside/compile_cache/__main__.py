"""`python3 compile_cache.pyz <command>`: the zip's root __main__ runs this module
(warmstart/manifests/pod_scripts.py). `exit_now` rather than sys.exit: see its docstring."""

from .main import exit_now, main

exit_now(main())
