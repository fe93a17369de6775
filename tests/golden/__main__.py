"""`python -m tests.golden`: after a deliberate change, refresh the shipped stacks' golden
renders, the README's render sample, docs/config-reference.md and the generated Args
(components/model_args.py, components/section_args.py)."""

from tests.golden import update

update()
