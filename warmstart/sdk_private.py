"""Every use of the Pulumi SDKs' private API in warmstart, in one place.

Each is here because the public SDK has no equivalent yet; tests/test_sdk_private.py fails,
naming what to do, the day an SDK upgrade removes or changes one (pin the SDK in pyproject.toml
back, or replace the use below).

- `program_config`: the flat config map the program was given (`pulumi.Config` reads one key
  of one namespace; the stack config is parsed as a whole, so a misspelt key is an error).
- `sync_await`: a model stack's decisions (its pool, TP, sizes) shape its resources, so its
  platform's `PlatformArgs` must be read while the program runs, not in an Output; the SDK's
  own synchronous invokes wait the same way.
- `DictProxy`, `ListProxy`, `is_unknown` (pulumi-policy): a policy reads a resource's inputs
  through these proxies; the checks (warmstart/policies) take plain values, unknowns marked.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from pulumi.runtime import config as _runtime_config
from pulumi.runtime.sync_await import _sync_await
from pulumi_policy.proxy import _DictProxy as DictProxy
from pulumi_policy.proxy import _ListProxy as ListProxy
from pulumi_policy.proxy import _is_unknown as is_unknown

T = TypeVar("T")
__all__ = ["DictProxy", "ListProxy", "is_unknown", "program_config", "sync_await"]

# The names this module uses, for tests/test_sdk_private.py.
USES = ("pulumi.runtime.config.get_config_env", "pulumi.runtime.config.CONFIG", "pulumi.runtime.sync_await._sync_await",
        "pulumi_policy.proxy._DictProxy", "pulumi_policy.proxy._ListProxy", "pulumi_policy.proxy._is_unknown")


def program_config() -> dict[str, str]:
    """The flat config map Pulumi handed this program (engine environment or mocks)."""
    return dict(_runtime_config.get_config_env()) | dict(_runtime_config.CONFIG.get())


def sync_await(awaitable: Awaitable[T]) -> T:
    """The awaitable's result, waited for while the program runs."""
    return _sync_await(awaitable)
