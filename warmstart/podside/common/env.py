"""Reading a pod script's settings from its environment: every problem is collected, so one run
of a misconfigured pod names them all (the scripts raise their own ConfigError with the list,
exit 2), instead of stopping at the first or raising a ValueError traceback."""

from __future__ import annotations

from typing import Any, Mapping


class EnvReader:
    """The environment variables of one script; `problems` holds what was wrong, in read order."""

    def __init__(self, env: Mapping[str, str]):
        self.env = env
        self.problems: list[str] = []

    def text(self, name: str, default: str = "", required: bool = False) -> str:
        """The variable stripped, else `default`; an unset required one is a problem."""
        value = self.env.get(name, "").strip() or default
        if required and not value:
            self.problems.append(f"{name} is not set")
        return value

    def number(self, name: str, default: float, *, integer: bool = False, minimum: float = 0) -> Any:
        """The variable as an int (`integer`) or a float, else `default` of that type; a value that
        is not one, or below `minimum`, is a problem (the default stands in for the former)."""
        kind = int if integer else float
        raw = self.env.get(name, "").strip()
        if not raw:
            return kind(default)
        try:
            value = kind(raw)
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not {'an integer' if integer else 'a number'}")
            return kind(default)
        if value < minimum:
            self.problems.append(f"{name}={raw!r} must be >= {minimum}")
        return value
