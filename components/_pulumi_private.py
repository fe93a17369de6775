"""Every use of the Pulumi SDK's private API in warmstart, in one place.

Each is here because the public SDK has no equivalent yet; tests/test_pulumi_private.py fails,
naming what to do, the day an SDK upgrade removes or changes one (pin pulumi in pyproject.toml
back, or replace the use below).

- `program_config`: the flat config map the program was given (`pulumi.Config` reads one key
  of one namespace; the stack config is parsed as a whole, so a misspelt key is an error).
- `sync_await`: a model stack's decisions (its pool, TP, sizes) shape its resources, so its
  platform's `PlatformArgs` must be read while the program runs, not in an Output; the SDK's
  own synchronous invokes wait the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from pulumi.runtime import config as _runtime_config
from pulumi.runtime.sync_await import _sync_await

T = TypeVar("T")

# The names this module uses, for tests/test_pulumi_private.py.
USES = ("pulumi.runtime.config.get_config_env", "pulumi.runtime.config.CONFIG", "pulumi.runtime.sync_await._sync_await")


def program_config() -> dict[str, str]:
    """The flat config map Pulumi handed this program (engine environment or mocks)."""
    return dict(_runtime_config.get_config_env()) | dict(_runtime_config.CONFIG.get())


def sync_await(awaitable: Awaitable[T]) -> T:
    """The awaitable's result, waited for while the program runs."""
    return _sync_await(awaitable)
