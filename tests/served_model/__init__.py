"""Tests of what a served model's component takes: the generated `models[]` entry Args."""
