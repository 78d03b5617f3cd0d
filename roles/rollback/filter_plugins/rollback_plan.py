"""Filters of role rollback: what to roll back to, and whether that is done already."""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_VENV = re.compile(r"/ml-env-[0-9a-f]+$")
_UNIT_VENV = re.compile(r'^Environment="?GLM5_ML_ENV=([^"\n]*)"?\s*$', re.M)


def unit_digest(text: str | None) -> str:
    """sha256 of a unit's text ("" for no unit): how the rollback record names a unit."""
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else ""


def rollback_plan(
    unit: str | None,
    good: str | None,
    previous: str | None,
    markers: Sequence[Mapping[str, Any]],
    current_venv: str,
    state: Any,
) -> dict[str, Any]:
    """Decide the rollback of the vLLM unit and the venv it runs on.

    ``unit``: the unit in place; ``good``: <unit>.good, the last unit that passed role
    vllm_service's readiness wait; ``previous``: <unit>.previous, the one that passed it
    before ``good`` (each None or "" when the file is absent or empty); ``markers``: the completion
    markers of the versioned venvs (``find`` results with ``path`` and ``mtime``);
    ``current_venv``: where the stable venv link points ("" = not a link); ``state``:
    the record of the last rollback (``{from, to, unit_to, good}``; anything else is none).

    The configuration in place (the unit and the venv link) is compared with the last good
    one: when it differs (a run failed at the readiness wait, or the venv was moved
    without a deploy), the target is the last good unit; when it is the last good one,
    the one that passed before it. Only units that passed the readiness wait are ever
    targets. The venv is the one the target unit names (GLM5_ML_ENV), which must still be
    complete. Done: the last rollback's unit and venv are in place and no unit passed the
    readiness wait since (a later good deploy re-arms it).

    Returns ``done``, ``target`` ("good", "previous" or "" when refused), ``unit`` (the
    target's text), ``venv`` (the venv to point the link at, "" = leave it), ``error``
    (why it is refused, "" otherwise) and ``record`` (what to write after the switch).
    """
    unit, good, previous = unit or None, good or None, previous or None
    complete = {
        posixpath.dirname(str(m["path"]))
        for m in markers
        if _VENV.search(posixpath.dirname(str(m["path"])))
    }
    record = state if isinstance(state, Mapping) else {}
    plan: dict[str, Any] = {"done": False, "target": "", "unit": "", "venv": "", "error": "", "record": {}}
    if (
        unit is not None
        and record.get("unit_to") == unit_digest(unit)
        and record.get("good") == unit_digest(good)
        and record.get("to", "") in ("", current_venv)
    ):
        plan["done"] = True
        return plan
    if good is None:
        plan["error"] = (
            "no unit has passed the readiness wait on this host (no {unit}.good recorded): "
            "nothing known to serve to roll back to"
        )
        return plan
    good_venv = rollback_unit_venv(good)
    in_place_is_good = unit == good and good_venv in ("", current_venv)
    if not in_place_is_good:
        target, text = "good", good
    elif previous is None or previous == good:
        plan["error"] = (
            "the unit in place is the last one that passed the readiness wait, and none passed "
            "before it (no {unit}.previous recorded): nothing earlier to roll back to"
        )
        return plan
    else:
        target, text = "previous", previous
    venv = rollback_unit_venv(text)
    if venv and venv not in complete:
        plan["error"] = (
            f"the last good unit ({{unit}}.{target}) runs on {venv}, which is no longer a complete "
            "venv (pruned? keep ml_env_keep at 2 or more)"
        )
        return plan
    if venv and venv != current_venv and not current_venv:
        plan["error"] = (
            f"the last good unit ({{unit}}.{target}) runs on {venv}, but the stable venv path is not "
            "a symlink to a versioned venv"
        )
        return plan
    good_after = good if target == "good" else previous
    plan.update(
        target=target,
        unit=text,
        venv=venv if venv and venv != current_venv else "",
        record={
            "from": current_venv,
            "to": venv or current_venv,
            "unit_from": unit_digest(unit),
            "unit_to": unit_digest(text),
            "good": unit_digest(good_after),
        },
    )
    return plan


def rollback_unit_venv(unit_text: str) -> str:
    """The versioned venv a vLLM unit was rendered for (its GLM5_ML_ENV), or ""."""
    match = _UNIT_VENV.search(unit_text or "")
    return match.group(1) if match else ""


class FilterModule:
    """rollback filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "rollback_plan": rollback_plan,
            "rollback_unit_venv": rollback_unit_venv,
            "rollback_unit_digest": unit_digest,
        }
