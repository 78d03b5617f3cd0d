"""Filters of role rollback: what to roll back to, and whether that is done already."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_VENV = re.compile(r"/ml-env-[0-9a-f]+$")
_UNIT_VENV = re.compile(r'^Environment="?GLM5_ML_ENV=([^"\n]*)"?\s*$', re.M)


def rollback_plan(
    markers: Sequence[Mapping[str, Any]],
    current: str,
    previous: str,
    state: Any,
) -> dict[str, Any]:
    """Decide the rollback.

    ``markers``: the completion markers of the versioned venvs (``find`` results with
    ``path`` and ``mtime``); ``current``: the venv the stable link points at;
    ``previous``: the venv role ml_env recorded when it last moved the link away from
    it (``.glm5-previous``); ``state``: the rollback record, ``{from, to}``, of the
    last rollback (anything else counts as none).

    Done: the last rollback went from ``state.from`` to ``state.to``, the link is still
    on ``to`` and ``previous`` still names ``from`` (role rollback writes it so). Any
    later move of the link by role ml_env (an upgrade, to the same or another lock)
    rewrites ``previous`` or moves the link, which re-arms the rollback.

    Target: ``previous`` when it is a complete venv other than the current one; else
    (no record, e.g. venvs made before the record existed) the newest complete venv
    other than the current one; "" when there is none.
    """
    complete = [
        posixpath.dirname(str(m["path"]))
        for m in sorted(markers, key=lambda m: float(m["mtime"]), reverse=True)
    ]
    complete = [path for path in complete if _VENV.search(path)]
    record = state if isinstance(state, Mapping) else {}
    done = bool(record.get("to")) and record.get("to") == current and record.get("from") == previous
    if previous and previous != current and previous in complete:
        target = previous
    else:
        target = next((path for path in complete if path != current), "")
    return {"done": done, "target": target}


def rollback_unit_venv(unit_text: str) -> str:
    """The versioned venv a vLLM unit was rendered for (its GLM5_ML_ENV), or ""."""
    match = _UNIT_VENV.search(unit_text or "")
    return match.group(1) if match else ""


class FilterModule:
    """rollback filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"rollback_plan": rollback_plan, "rollback_unit_venv": rollback_unit_venv}
