"""A stand-in for the Automation API's Stack, for the command and environment tests."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import CommandError


def _update_summary(kind: str, changes: dict[str, int]) -> auto.UpdateSummary:
    return auto.UpdateSummary(kind=kind, start_time=datetime(2026, 1, 1), message="", environment={},
                              config={}, result="succeeded", end_time=datetime(2026, 1, 1),
                              version=7, resource_changes=changes)


class FakeStack:
    """Stands in for pulumi.automation.Stack; records each call and its keyword arguments."""

    def __init__(self, changes: dict[str, int] | None = None, outputs: dict | None = None,
                 fail: bool = False, policy_events: list[events.PolicyEvent] = ()) -> None:
        self.changes = changes if changes is not None else {"same": 5}
        self.outputs_map = outputs or {}
        self.fail = fail
        self.policy_events = list(policy_events)
        self.calls: list[tuple[str, dict]] = []
        self.config_file: Path | None = None

    def _run(self, op: str, kwargs: dict) -> None:
        self.calls.append((op, kwargs))
        kwargs["on_output"](f"fake engine output for {op}")
        for i, p in enumerate(self.policy_events):
            kwargs["on_event"](events.EngineEvent(sequence=i, timestamp=0, policy_event=p))
        if self.fail:
            raise CommandError(CommandResult(stdout="", stderr="error: update failed", code=255))

    def preview(self, **kw):
        self._run("preview", kw)
        return auto.PreviewResult(stdout="", stderr="", change_summary=self.changes)

    def preview_refresh(self, **kw):
        self._run("preview_refresh", kw)
        return auto.PreviewResult(stdout="", stderr="", change_summary=self.changes)

    def up(self, **kw):
        self._run("up", kw)
        return auto.UpResult(stdout="", stderr="", summary=_update_summary("update", self.changes),
                             outputs=self.outputs_map)

    def refresh(self, **kw):
        self._run("refresh", kw)
        return auto.RefreshResult(stdout="", stderr="", summary=_update_summary("refresh", self.changes))

    def destroy(self, **kw):
        self._run("destroy", kw)
        return auto.DestroyResult(stdout="", stderr="", summary=_update_summary("destroy", self.changes))

    def outputs(self):
        self.calls.append(("outputs", {}))
        return self.outputs_map

    def set_config(self, key, value, *, path=False):
        """As `pulumi config set` does: the key in the stack file of `config_file`, if any."""
        self.calls.append(("set_config", {"key": key, "value": value.value, "secret": value.secret}))
        if self.config_file is not None:
            with self.config_file.open("a") as f:
                f.write(f'  {key}: "{value.value}"\n')
