"""Test-side models of what the cluster does with the render (not shipped code)."""
