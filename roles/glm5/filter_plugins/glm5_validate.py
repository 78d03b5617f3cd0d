"""Filters of the validation phase (playbooks/validate.yml, every role's tasks/validate.yml).

glm5_path_problem holds the one rule every path variable is checked against: absolute,
normalized, and not a system directory; glm5_port_problem the one rule for TCP ports.
glm5_tp_problem the one rule for the tensor-parallel size (role preflight and role
vllm_service both read it). glm5_refusals turns a role's list of checks into the lines of the refusal: only the
checks that failed, one line each.
"""

from __future__ import annotations

import posixpath
from typing import Any

# Directories a deployment must never own, replace or remove: the root, the system
# trees, and the parents under which a deployment gets a directory of its own (/opt,
# /srv, /home ...) as themselves. A directory below them (/opt/ml-env) is accepted.
SYSTEM_DIRS: frozenset[str] = frozenset(
    {
        "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
        "/lost+found", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap",
        "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib32",
        "/usr/lib64", "/usr/libexec", "/usr/local", "/usr/local/bin", "/usr/local/lib",
        "/usr/local/sbin", "/usr/sbin", "/usr/share", "/usr/src", "/var", "/var/cache",
        "/var/lib", "/var/log", "/var/spool", "/var/tmp",
    }
)
# Trees in which nothing may be placed at all (kernel, device and runtime file systems,
# the boot partition): a path inside them is refused too, not only the tree itself.
SYSTEM_TREES: tuple[str, ...] = ("/boot", "/dev", "/proc", "/run", "/sys")

ACCEPTED = "an absolute, normalized path (no '..', '.', '//' or trailing '/') outside the system directories"


def glm5_path_problem(value: Any, name: str, allow_empty: bool = False) -> str:
    """'' when ``value`` is an acceptable path for variable ``name``, else one sentence.

    The sentence names the variable, the value and the accepted form. ``allow_empty``:
    "" means "not set" for this variable (e.g. glm5_ca_bundle) and is accepted.
    """
    if value is None or value == "":
        if allow_empty:
            return ""
        return f"{name} is empty; expected {ACCEPTED}."
    if not isinstance(value, str):
        return f"{name} = {value!r} is not a string; expected {ACCEPTED}."
    if "\x00" in value or "\n" in value:
        return f"{name} = {value!r} contains a NUL or newline; expected {ACCEPTED}."
    if not value.startswith("/"):
        return f"{name} = {value!r} is a relative path; expected {ACCEPTED}."
    if posixpath.normpath(value) != value or value.startswith("//"):
        return (
            f"{name} = {value!r} is not normalized (it reads as {posixpath.normpath(value)!r});"
            f" expected {ACCEPTED}."
        )
    if value in SYSTEM_DIRS:
        return f"{name} = {value!r} is a system directory; expected {ACCEPTED}."
    for tree in SYSTEM_TREES:
        if value.startswith(tree + "/"):
            return f"{name} = {value!r} lies inside the system directory {tree}; expected {ACCEPTED}."
    return ""


def glm5_port_problem(value: Any, name: str, allow_zero: bool = False) -> str:
    """'' when ``value`` is a TCP port (1-65535; 0 too with ``allow_zero``), else one sentence."""
    text = str(value).strip() if value is not None and not isinstance(value, bool) else ""
    low = 0 if allow_zero else 1
    accepted = "a TCP port 1-65535" + (", or 0 for none" if allow_zero else "")
    if not text.isdigit() or not low <= int(text) <= 65535:
        return f"{name} = {value!r} is refused; expected {accepted}."
    return ""


def glm5_tp_problem(value: Any, name: str, heads: Any, gpu_count: Any = None) -> str:
    """'' when ``value`` is a usable tensor-parallel size, else one sentence.

    Usable: a whole number >= 1 that divides the model's ``heads`` attention heads and,
    when ``gpu_count`` is given (not None), is at most the host's GPU count.
    """
    text = str(value).strip() if value is not None and not isinstance(value, bool) else ""
    n_heads = int(heads)
    shown = text if text.isdigit() else repr(value)
    if not text.isdigit() or int(text) < 1 or n_heads % int(text) != 0:
        divisors = ", ".join(str(d) for d in range(1, n_heads + 1) if n_heads % d == 0)
        return (
            f"{name} = {shown} is refused; expected a divisor of the model's {n_heads} attention heads"
            f" ({divisors})."
        )
    if gpu_count is not None and int(text) > int(gpu_count):
        return f"{name} = {shown} exceeds glm5_gpu_count {int(gpu_count)}; expected at most the host's GPU count."
    return ""


def glm5_refusals(checks: Any) -> list[str]:
    """The messages of the failed checks.

    ``checks`` is a list of strings (a failed check's message; "" for a check that
    passed) or of lists of such strings (a check over several values), as a role's
    tasks/validate.yml builds it.
    """
    if not isinstance(checks, list):
        raise TypeError(f"glm5_refusals expects a list of messages, got {type(checks).__name__}")
    out: list[str] = []
    for check in checks:
        items = check if isinstance(check, list) else [check]
        for item in items:
            text = "" if item is None else str(item).strip()
            if text and text not in out:
                out.append(text)
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "glm5_path_problem": glm5_path_problem,
            "glm5_port_problem": glm5_port_problem,
            "glm5_refusals": glm5_refusals,
            "glm5_tp_problem": glm5_tp_problem,
        }
