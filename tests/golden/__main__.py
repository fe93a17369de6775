"""`python -m tests.golden`: after a deliberate change, refresh the shipped stacks' golden
renders, the README's render sample, docs/config-reference.md, the generated Args
(components/model_args.py, components/section_args.py), (for an Unreleased CHANGELOG.md
entry) components/schema.lock, and components/README.md."""

from tests.golden import update

update()
