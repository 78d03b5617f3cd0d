"""The validation phase's choice of roles, from the phase table (playbooks/vars/phases.yml)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def glm5_phase_roles(table: Mapping[str, Mapping[str, Any]], run_tags: Iterable[str], phase: str = "",
                     hosts: str = "gpu_servers") -> list[str]:
    """The roles of group `hosts` whose checks this run makes, in the table's order.

    A role with checks is chosen when the importing playbook applies or reads it (`phase`:
    one of its tags; "" for site.yml, which applies every role) and the run's tags select
    it (one of its tags or its `also` tags). Tags that name no role's tag (all, validate,
    a tag of a role's own tasks) select every role.
    """
    def names(row: Mapping[str, Any]) -> set[str]:
        return set(row["tags"]) | set(row.get("also", []))

    known = set().union(*(names(row) for row in table.values()))
    selected = set(run_tags) & known
    return [role for role, row in table.items()
            if row.get("hosts", "gpu_servers") == hosts and row.get("checks", True)
            and (not phase or phase in names(row)) and (not selected or selected & names(row))]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"glm5_phase_roles": glm5_phase_roles}
