"""User-facing errors: every one names the config key, the rule it broke and the fix."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


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


class Problems:
    """Every broken rule of one validation pass, reported together.

    A planner records what it finds with `add()` and ends with `raise_if_any()`; a caller that
    runs several planners wraps each in `collect()` so one planner's errors do not hide the
    next one's, then calls `raise_if_any()` once. Planners never return None for "invalid".
    """

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def add(self, key: str, rule: str, fix: str, value: object = None) -> None:
        self.errors.append(ConfigError(key, rule, fix, value))

    def __len__(self) -> int:
        return len(self.errors)

    @contextmanager
    def collect(self) -> Iterator[None]:
        """Run a step; its ConfigError(s) are recorded instead of raised."""
        try:
            yield
        except ConfigErrors as err:
            self.errors.extend(err.errors)
        except ConfigError as err:
            self.errors.append(err)

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigErrors(list(self.errors))
