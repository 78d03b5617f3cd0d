"""Writing user values into systemd files so that systemd reads back exactly those bytes.

One place for every template of the project that puts a value from the inventory (or the
vault) into a file systemd parses. Three places in those files, three sets of rules
(systemd.exec(5), systemd.service(5), systemd.syntax(7)); each filter writes a
double-quoted word:

``glm5_systemd_env_file_line(name, value)``  a line of an ``EnvironmentFile=``:
    ``NAME="value"``. Inside double quotes the file's parser keeps every character but
    treats a backslash before one of ``" \\ ` $`` as an escape (and a backslash before a
    newline as a line continuation). So each of those four is written with a backslash
    before it; nothing else is special (``'``, ``#``, ``;``, ``%``, spaces and non-ASCII
    text are kept as they are; no ``$VAR`` is expanded in an environment file).

``glm5_systemd_environment(name, value)``  the word of an ``Environment=`` line of a
    unit: ``"NAME=value"``. The unit parser splits the line into words (quotes, C-style
    backslash escapes) and then expands ``%`` specifiers in each word: ``\\`` and ``"``
    get a backslash, ``%`` is doubled. ``$`` has no meaning there.

``glm5_systemd_exec_args(list)``  the argument words of ``ExecStart=`` (and the other
    Exec lines): each word double-quoted, ``\\`` and ``"`` with a backslash, ``%``
    doubled (specifiers) and ``$`` doubled (systemd replaces ``$NAME``/``${NAME}`` with
    environment variables in command lines; ``$$`` is one ``$``).

What none of these files can carry is refused, never written: a newline or carriage
return (a line break would start a new assignment: ``KEY\\nINJECTED=1``), NUL, any other
control character but tab, text that is not UTF-8 (Ansible hands such bytes on as lone
surrogates), the byte order mark and Unicode noncharacters (systemd refuses them in
environment files). ``glm5_systemd_problem(value)`` names the first such character and
its position (never the value: it may be a secret), or returns "" when the value can be
written; the roles' validate.yml assert on it before any change, and the quoting filters
raise the same sentence if a value reaches them anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ansible.errors import AnsibleFilterError

# An environment variable name systemd accepts and a shell can export.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_NAMED = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL character"}


def _char_problem(ch: str) -> str | None:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if (code < 0x20 and ch != "\t") or code == 0x7F:
        return f"a control character (U+{code:04X})"
    if 0xD800 <= code <= 0xDFFF:
        return "bytes that are not UTF-8"
    if code == 0xFEFF:
        return "a byte order mark (U+FEFF)"
    if 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
        return f"a Unicode noncharacter (U+{code:04X})"
    return None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise AnsibleFilterError(
        f"a systemd value must be a string or a number, got a {type(value).__name__}"
    )


def systemd_problem(value: Any) -> str:
    """What in ``value`` systemd files cannot carry ("" = nothing). Never quotes the value."""
    try:
        text = _text(value)
    except AnsibleFilterError as exc:
        return str(exc)
    for index, ch in enumerate(text):
        problem = _char_problem(ch)
        if problem is not None:
            return f"contains {problem} at character {index + 1} of {len(text)}"
    return ""


def http_token_problem(value: Any) -> str:
    """What keeps ``value`` from being sent as an HTTP Bearer token ("" = nothing).

    vLLM compares the Authorization header as the server decodes it (latin-1) with the
    key's UTF-8 bytes, HTTP clients send header values as ASCII (httpx refuses anything
    else) and servers strip spaces around a header value: a key is printable ASCII
    (space to ~) without a space at either end. Never quotes the value."""
    if not isinstance(value, str) or value == "":
        return "is empty" if value == "" else f"is a {type(value).__name__}, not a string"
    problem = systemd_problem(value)
    if problem:
        return problem
    for index, ch in enumerate(value):
        if not " " <= ch <= "~":
            return f"contains a character outside printable ASCII (U+{ord(ch):04X}) at character {index + 1}"
    if value[0] == " " or value[-1] == " ":
        return "starts or ends with a space"
    return ""


def env_name_problem(name: Any) -> str:
    """What makes ``name`` no environment variable name ("" = nothing)."""
    if not isinstance(name, str) or ENV_NAME.fullmatch(name) is None:
        return "is not an environment variable name (letters, digits and _, not starting with a digit)"
    return ""


def environment_problems(mapping: Any, variable: str) -> list[str]:
    """One sentence per entry of ``mapping`` (name -> value) that a unit cannot carry,
    each naming ``variable`` and the entry's name (never its value)."""
    if not isinstance(mapping, dict):
        return [f"{variable} must be a mapping of variable names to values, got a {type(mapping).__name__}"]
    out = []
    for name, value in mapping.items():
        problem = env_name_problem(name)
        if problem:
            out.append(f"{variable}: {str(name)!r} {problem}")
            continue
        problem = systemd_problem(value)
        if problem:
            out.append(f"{variable}: the value of {name} {problem}")
    return out


def exec_problems(words: Any, variable: str) -> list[str]:
    """One sentence per word of ``words`` (a command line) that a unit cannot carry."""
    if not isinstance(words, list):
        return [f"{variable} must be a list of words, got a {type(words).__name__}"]
    return [f"{variable}: word {index + 1} {problem}"
            for index, problem in enumerate(systemd_problem(w) for w in words) if problem]


def _checked(value: Any, what: str) -> str:
    problem = systemd_problem(value)
    if problem:
        raise AnsibleFilterError(f"{what} {problem}: systemd cannot carry it (one line of UTF-8 text)")
    return _text(value)


def _checked_name(name: Any) -> str:
    problem = env_name_problem(name)
    if problem:
        raise AnsibleFilterError(f"environment variable name {name!r} {problem}")
    return str(name)


def _escape(text: str, specials: str) -> str:
    return "".join("\\" + ch if ch in specials else ch for ch in text)


def env_file_line(name: Any, value: Any) -> str:
    """``NAME="value"`` for an EnvironmentFile=; systemd reads back ``value`` exactly."""
    key = _checked_name(name)
    text = _checked(value, f"the value of {key}")
    return f'{key}="{_escape(text, chr(92) + chr(34) + "`$")}"'


def unit_environment(name: Any, value: Any) -> str:
    """``"NAME=value"``, one word of a unit's Environment= line."""
    key = _checked_name(name)
    text = _checked(value, f"the value of {key}")
    return '"' + _escape(f"{key}={text}", chr(92) + chr(34)).replace("%", "%%") + '"'


def exec_arg(value: Any) -> str:
    """One argument word of an Exec*= line."""
    text = _checked(value, "a command-line argument")
    return '"' + _escape(text, chr(92) + chr(34)).replace("%", "%%").replace("$", "$$") + '"'


def exec_args(values: Iterable[Any]) -> str:
    """The words of an Exec*= line (the program first), each one quoted."""
    if isinstance(values, (str, bytes)):
        raise AnsibleFilterError("glm5_systemd_exec_args takes a list of words, not a string")
    return " ".join(exec_arg(v) for v in values)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "glm5_systemd_problem": systemd_problem,
            "glm5_env_name_problem": env_name_problem,
            "glm5_http_token_problem": http_token_problem,
            "glm5_systemd_environment_problems": environment_problems,
            "glm5_systemd_exec_problems": exec_problems,
            "glm5_systemd_env_file_line": env_file_line,
            "glm5_systemd_environment": unit_environment,
            "glm5_systemd_exec_args": exec_args,
        }
