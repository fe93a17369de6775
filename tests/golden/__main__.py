"""`python -m tests.golden`: after a deliberate change, refresh the shipped stacks' golden
renders, the README's render sample and docs/config-reference.md."""

from tests.golden import update

update()
