"""Pulumi entry point; all logic lives in the warmstart package."""

from warmstart.program import main

main()
