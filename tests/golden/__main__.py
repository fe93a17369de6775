"""`python -m tests.golden`: refresh the golden renders after a deliberate change."""

from tests.golden import update

update()
