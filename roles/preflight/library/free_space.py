#!/usr/bin/python
"""Ansible module: free space of the file system that holds (or will hold) a path."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: free_space
short_description: Free space where a path is or will be
description:
  - Walks up from C(path) to the nearest existing directory and reports the free
    and total bytes of its file system (statvfs), so a directory that the
    deployment will create later can be checked before anything is created.
    Never changes anything.
options:
  path:
    description: The path to check; need not exist.
    type: path
    required: true
author: glm5-deploy
"""

EXAMPLES = r"""
- name: Free space for the model
  free_space:
    path: /srv/models/glm-5
  register: preflight_disk
"""

RETURN = r"""
checked:
  description: The existing directory that was measured.
  type: str
  returned: always
free_bytes:
  description: Bytes available to unprivileged users on that file system.
  type: int
  returned: always
total_bytes:
  description: Size of that file system in bytes.
  type: int
  returned: always
"""

import os
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule


def nearest_existing(path: Path) -> Path:
    """Return ``path`` or its deepest ancestor that exists as a directory."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return Path("/")


def measure(path: Path) -> dict[str, object]:
    checked = nearest_existing(path)
    stats = os.statvfs(checked)
    return {
        "checked": str(checked),
        "free_bytes": stats.f_bavail * stats.f_frsize,
        "total_bytes": stats.f_blocks * stats.f_frsize,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **measure(Path(module.params["path"])))


if __name__ == "__main__":
    main()
