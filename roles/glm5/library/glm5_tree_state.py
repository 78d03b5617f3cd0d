#!/usr/bin/python
"""Ansible module: does a deployed tree already hold the controller's files as copy would leave them?

A recursive ansible.builtin.copy (or a copy loop) checks every file with its own round
trip to the host, even when nothing differs: seconds per tree on a no-op run. This
module checks them all in one: each file of I(files) (relative path -> sha256, filter
tree_manifest of role glm5 on the controller) must be a regular file under I(path) with
that sha256, I(mode), I(owner) and I(group). The copy task runs only when something
differs (in_sync false), so a change, check mode and --diff are the copy's own. It
never changes anything.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_tree_state
short_description: Compare a deployed tree with the controller's files (one round trip)
description:
  - Reports in_sync true when every file of I(files) is a regular file under I(path) with the
    given sha256, mode, owner and group; otherwise the files that differ and why. Read only.
options:
  path: {description: The deployed tree's root (absolute)., type: path, required: true}
  files: {description: Relative path -> sha256 of each file the tree must hold., type: dict, required: true}
  mode: {description: Octal mode each file must have (e.g. "0644")., type: str, required: true}
  owner: {description: Owner each file must have., type: str, required: true}
  group: {description: Group each file must have., type: str, required: true}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_tree_state:
    path: /opt/glm5/patches/vllm-0.20.2
    files: "{{ vllm_patches_source_dir | tree_manifest }}"
    mode: "0644"
    owner: root
    group: root
  register: tree
"""

RETURN = r"""
in_sync: {description: Whether every file is in place as given., type: bool, returned: always}
differ: {description: "'relative path: reason' for each file that is not.", type: list, returned: always}
"""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:  # noqa: PTH123 - the module stays on os paths
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def file_differs(root: str, rel: str, sha256: str, mode: int, owner: str, group: str) -> str:
    """Why the file `rel` under `root` is not as given ("" when it is)."""
    if rel.startswith("/") or ".." in rel.split("/"):
        return "not a relative path inside the tree"
    path = os.path.join(root, rel)  # noqa: PTH118
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    reasons = []
    if stat.S_IMODE(st.st_mode) != mode:
        reasons.append(f"mode {stat.S_IMODE(st.st_mode):04o}")
    if _name(pwd.getpwuid, st.st_uid) != owner:
        reasons.append(f"owner {_name(pwd.getpwuid, st.st_uid)}")
    if _name(grp.getgrgid, st.st_gid) != group:
        reasons.append(f"group {_name(grp.getgrgid, st.st_gid)}")
    if _sha256(path) != sha256:
        reasons.append("content")
    return ", ".join(reasons)


def tree_state(root: str, files: dict[str, str], mode: str, owner: str, group: str) -> dict[str, Any]:
    """in_sync and the differing files of `files` under `root`."""
    try:
        want_mode = int(mode, 8)
    except ValueError:
        raise ValueError(f"glm5_tree_state: mode must be octal like 0644 (got {mode!r})") from None
    differ = []
    for rel in sorted(files):
        why = file_differs(root, rel, str(files[rel]), want_mode, owner, group)
        if why:
            differ.append(f"{rel}: {why}")
    return {"in_sync": not differ, "differ": differ}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "files": {"type": "dict", "required": True},
            "mode": {"type": "str", "required": True},
            "owner": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = tree_state(p["path"], p["files"], p["mode"], p["owner"], p["group"])
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
