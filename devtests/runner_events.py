"""The events of one ansible-runner run, read the way the bad-input tests need:
which task failed first, and which tasks before it reported a change.

Shared by devtests/runner (site.yml against a systemd container) and
devtests/service (the service playbooks in check mode on this machine)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

TASK_EVENTS = {"runner_on_ok", "runner_on_failed", "runner_on_skipped"}


@dataclass
class Run:
    rc: int
    events: list[dict[str, Any]]

    def task_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") in TASK_EVENTS]

    def first_failure(self) -> dict[str, Any]:
        failed = [e for e in self.task_events() if e["event"] == "runner_on_failed"]
        assert failed, "expected a failed task"
        return failed[0]

    def failure_message(self) -> str:
        """The first failed task's message; of a loop (a readiness wait's rounds), its failed round's."""
        res = self.first_failure()["event_data"]["res"]
        failed = [r for r in res.get("results", []) if r.get("failed")]
        return str((failed[-1] if failed else res).get("msg", ""))

    def failed_at(self) -> float:
        """When the first failed task's event was written (ansible-runner's UTC stamp), epoch seconds."""
        return datetime.fromisoformat(self.first_failure()["created"]).replace(tzinfo=UTC).timestamp()

    def changed_before(self, failure: dict[str, Any]) -> list[str]:
        events = self.task_events()
        return [
            e["event_data"].get("task", "?")
            for e in events[: events.index(failure)]
            if e["event_data"].get("res", {}).get("changed")
        ]

    def ok_tasks(self) -> list[str]:
        return [e["event_data"].get("task", "?") for e in self.task_events() if e["event"] == "runner_on_ok"]
