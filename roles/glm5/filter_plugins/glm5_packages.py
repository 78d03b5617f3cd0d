"""The host's package state, read once, and whether an apt install would change it.

roles/glm5/tasks/dpkg_state.yml reads every package's version, selection (want) and
status with one dpkg-query; dpkg_state() turns that into a dict, kept as the host
fact glm5_dpkg. roles/glm5/tasks/apt.yml then skips its apt task when
apt_satisfied() says every requested package is installed as asked: what the apt
module's state=present would find too, without opening apt's cache. Whatever this
module cannot decide exactly (a version relation, an architecture qualifier, a name
dpkg does not list, a half-installed package) counts as not satisfied, so apt runs
and decides, and check mode reports the change as before. dpkg_unheld() gives the
packages of a list that dpkg does not hold yet (the hold tasks loop over those).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

# dpkg-query -W -f='${Package} ${Version} ${db:Status-Want} ${db:Status-Status}\n'
DPKG_QUERY_FORMAT = "${Package} ${Version} ${db:Status-Want} ${db:Status-Status}\\n"

# Debian policy: package names are lower case letters, digits, + - . (at least two).
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# A version as apt takes it after '=': Debian version characters and apt's glob '*'.
_VERSION = re.compile(r"^[A-Za-z0-9.+~:*-]+$")

Entry = dict[str, str]


def dpkg_state(stdout: str) -> dict[str, Entry]:
    """Parse the query's lines into {name: {"version", "want", "status"}}.

    A name listed twice (multi-arch copies) keeps a field only where the copies agree,
    else the field is empty: such a package is neither "installed" nor "hold" to the
    filters below, which then let apt decide."""
    state: dict[str, Entry] = {}
    for line in str(stdout).splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        name, version, want, status = parts
        entry = {"version": version, "want": want, "status": status}
        old = state.get(name)
        if old is not None:
            entry = {k: v if old[k] == v else "" for k, v in entry.items()}
        state[name] = entry
    return state


def _specs(packages: Any) -> list[str]:
    if isinstance(packages, str):
        return [packages]
    if isinstance(packages, Iterable) and not isinstance(packages, Mapping):
        return [str(p) for p in packages]
    raise TypeError(f"apt_satisfied: packages must be a name or a list of names (got {packages!r})")


def _one_satisfied(spec: str, state: Mapping[str, Mapping[str, str]]) -> bool:
    name, sep, version = spec.strip().partition("=")
    if not _NAME.match(name) or (sep and not _VERSION.match(version)):
        return False  # '>=', ':arch', a path or a URL: apt decides
    entry = state.get(name)
    if entry is None or entry.get("status") != "installed":
        return False
    if not sep:
        return True
    return fnmatch.fnmatchcase(entry.get("version", ""), version)


def apt_satisfied(packages: Any, state: Mapping[str, Mapping[str, str]] | None) -> bool:
    """True when apt's state=present would change nothing: every entry of `packages`
    ("name", "name=version" or "name=version-glob*", as the apt module takes them) is
    installed, at a matching version where one is given. An empty list is satisfied;
    no state (not read) is not."""
    specs = _specs(packages)
    if state is None:
        return False
    return all(_one_satisfied(spec, state) for spec in specs)


def dpkg_unheld(packages: Any, state: Mapping[str, Mapping[str, str]] | None) -> list[str]:
    """The names in `packages` (a version after '=' is dropped) that dpkg does not
    hold, in the given order: all of them when the state is not read."""
    names = [spec.strip().partition("=")[0] for spec in _specs(packages)]
    if state is None:
        return names
    return [n for n in names if state.get(n, {}).get("want") != "hold"]


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "dpkg_state": dpkg_state,
            "apt_satisfied": apt_satisfied,
            "dpkg_unheld": dpkg_unheld,
        }
