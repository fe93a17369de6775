"""The tests' support library (not shipped code): what more than one test module uses, such as
models of what the cluster does with a render, validators, stand-ins and strategies. Test
modules import from here, never from one another (tests/test_structure.py checks it)."""
