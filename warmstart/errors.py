"""User-facing errors: every one names the config key, the rule it broke and the fix."""

from __future__ import annotations


class ConfigError(Exception):
    """A stack config that cannot produce correct infrastructure.

    The CLI prints ``str(err)`` and exits 2; no traceback reaches the user.
    """

    def __init__(self, key: str, rule: str, fix: str, value: object = None) -> None:
        self.key = key
        self.rule = rule
        self.fix = fix
        self.value = value
        shown = "" if value is None else f"={value!r}"
        super().__init__(f"{key}{shown}: {rule}; fix: {fix}")


class ConfigErrors(Exception):
    """Several config errors found in one pass, reported together."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
