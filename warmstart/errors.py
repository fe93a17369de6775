"""User-facing errors: every one names the config key, the rule it broke and the fix."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping


class ConfigError(Exception):
    """A stack config that cannot produce correct infrastructure.

    The CLI prints ``str(err)`` and exits 2; no traceback reaches the user.
    """

    def __init__(self, key: str, rule: str, fix: str, value: object = None) -> None:
        self.key = key
        self.rule = rule
        self.fix = fix
        self.value = value
        shown = "" if value is None else f"={_short(value)}"
        super().__init__(f"{key}{shown}: {rule}; fix: {fix}")


# A message is one line a user reads: the value it echoes is cut to this many characters.
VALUE_SHOWN_MAX = 120


def _short(value: object) -> str:
    shown = repr(value)
    if len(shown) <= VALUE_SHOWN_MAX:
        return shown
    size = f", {len(value)} characters" if isinstance(value, (str, bytes)) else ""
    return f"{shown[:VALUE_SHOWN_MAX - 20]}... (cut{size})"


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


def _rekey(err: ConfigError, inner: str, outer: str, fields: Mapping[str, str] | None) -> ConfigError:
    key = err.key
    if key == inner:
        return ConfigError(outer, err.rule, err.fix, err.value)
    if not key.startswith((f"{inner}.", f"{inner}[")):
        return err
    rest = key[len(inner):]
    if rest.startswith("."):
        field, sep, tail = rest[1:].partition(".")
        field, bracket, index = field.partition("[")
        tail = (bracket + index if bracket else "") + (sep + tail if sep else "")
        if fields is not None and field not in fields:
            # A value the caller derived, not one its user wrote: name the block it came from.
            return ConfigError(outer, f"(its {field}{tail}) {err.rule}", err.fix, err.value)
        return ConfigError(f"{outer}.{field if fields is None else fields[field]}{tail}", err.rule, err.fix, err.value)
    return ConfigError(outer + rest, err.rule, err.fix, err.value)


@contextmanager
def rekeyed(inner: str, outer: str, fields: Mapping[str, str] | None = None) -> Iterator[None]:
    """Report an inner component's config errors under the key its caller's user wrote: an
    error keyed `<inner>.<field>...` is re-raised keyed `<outer>.<fields[field]>...` (so
    `ModelRouterArgs.loadFactor` from a stack's model is `warmstart:models[0].routing.loadFactor`).
    With `fields`, a field not in it (one the caller derived) is reported as `<outer>` itself,
    the rule naming the field; without, every field keeps its name."""
    try:
        yield
    except (ConfigError, ConfigErrors) as err:
        found = err.errors if isinstance(err, ConfigErrors) else [err]
        moved = [_rekey(e, inner, outer, fields) for e in found]
        raise (ConfigErrors(moved) if isinstance(err, ConfigErrors) else moved[0]) from None


def listing(items: list[str], cap: int = 8) -> str:
    """`a, b, c` of at most `cap` items, then `and N more`: a message line stays short however
    long the list it quotes (a stack file can repeat one value thousands of times)."""
    shown = ", ".join(items[:cap])
    return shown + (f" and {len(items) - cap} more" if len(items) > cap else "")
