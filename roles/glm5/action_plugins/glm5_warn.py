"""Action plugin: print each of ``msg`` as an Ansible warning ([WARNING]: ...), on the controller.

The validation phase warns with it about settings no role declares (a misspelt name
is silently ignored otherwise); a warning does not stop the run. Changes nothing.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible-core ships no type stubs
    """glm5_warn: msg (a string or a list of strings)."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = dict(super().run(tmp, task_vars))
        messages = self._task.args.get("msg", [])
        if isinstance(messages, str):
            messages = [messages]
        if not isinstance(messages, list):
            raise AnsibleActionFail("glm5_warn: msg must be a string or a list of strings")
        host = (task_vars or {}).get("inventory_hostname", "")
        for message in messages:
            display.warning(f"{host}: {message}" if host else str(message))
        result.update(changed=False, warned=[str(m) for m in messages])
        return result
