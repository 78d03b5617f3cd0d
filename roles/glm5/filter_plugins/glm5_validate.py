"""Filters of the validation phase (playbooks/validate.yml, every role's tasks/validate.yml).

One rule per kind of value, each yielding "" (accepted) or one sentence naming the
variable, the value and the accepted form:
- glm5_spec_refusals: the types and choices of a role's meta/argument_specs.yml (strict:
  an integer is written as a whole number, a list is a list), in place of Ansible's own
  messages;
- glm5_path_problem: absolute, normalized (a trailing '/' is the same directory),
  not a system directory; glm5_host_refusals applies it again to the path as the host
  resolves it (symbolic links followed);
- glm5_port_problem: a TCP port; glm5_host_refusals: SSH's ports, the privileged range,
  another service's port of this project, a port another program holds;
- glm5_url_problem: proxy and package index URLs (scheme, host, port);
- glm5_tp_problem: the tensor-parallel size (role preflight and role vllm_service).
glm5_refusals turns a role's list of checks into the lines of the refusal: only the
checks that failed, one line each, none for a shared setting an earlier line refused.
glm5_unknown_settings names, for a role-prefixed variable no role declares, the nearest
declared one.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

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
# The operating system's own trees (the distribution's files, its package database, the
# kernel's and systemd's): a path a deployment writes that a symbolic link leads into one
# of them, from a spelling outside it, is refused. /bin, /sbin and /lib* are /usr's
# (merged /usr); /usr/local is not the OS's.
OS_TREES: dict[str, str] = {
    "/etc": "/etc", "/usr": "/usr", "/bin": "/usr", "/sbin": "/usr", "/lib": "/usr", "/lib32": "/usr",
    "/lib64": "/usr", "/libx32": "/usr", "/boot": "/boot", "/dev": "/dev", "/proc": "/proc", "/sys": "/sys",
    "/run": "/run", "/root": "/root", "/snap": "/snap", "/var/lib/dpkg": "/var/lib/dpkg",
    "/var/lib/apt": "/var/lib/apt", "/var/lib/systemd": "/var/lib/systemd",
}

ACCEPTED = "an absolute, normalized path (no '..', '.', '//') outside the system directories"
ACCEPTED_RESOLVED = "a path that lies outside the system directories as the host resolves it"

# Unset option of a role (glm5_spec_inputs / the vars lookup's default).
UNSET = "__glm5_unset__"
BOOL_WORDS: frozenset[str] = frozenset({"yes", "no", "true", "false", "on", "off", "y", "n", "t", "f", "1", "0"})
INT_TEXT = re.compile(r"^(0|-?[1-9][0-9]*)$")
FLOAT_TEXT = re.compile(r"^-?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$")
# The subject of a refusal line: its variable, and the shared glm5_ variable it comes
# from ("vllm_service_port (glm5_api_port) = 0 ..."); a line that names no variable
# first ("the host's architecture ...") has none.
SUBJECT = re.compile(r"^([a-z][a-z0-9]*_[a-z0-9_]*)(?: \((glm5_[a-z0-9_]+)\))?")
PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")
INDEX_SCHEMES = ("http", "https", "file")


def _shown(value: Any, limit: int = 120) -> str:
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[: limit - 5] + "...'" if isinstance(value, str) else text[:limit] + "..."


def glm5_normpath(value: Any) -> Any:
    """``value`` without a trailing '/' (a directory's equivalent spelling); other values as given."""
    if isinstance(value, str) and len(value) > 1 and value.endswith("/") and not value.startswith("//"):
        stripped = value.rstrip("/")
        return stripped or "/"
    return value


def glm5_path_problem(value: Any, name: str, allow_empty: bool = False) -> str:
    """'' when ``value`` is an acceptable path for variable ``name``, else one sentence.

    The sentence names the variable, the value and the accepted form. ``allow_empty``:
    "" means "not set" for this variable (e.g. glm5_ca_bundle) and is accepted. A
    trailing '/' is the same directory: accepted (the validation phase drops it,
    glm5_host_refusals).
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
    path = glm5_normpath(value)
    if posixpath.normpath(path) != path or path.startswith("//"):
        return (
            f"{name} = {value!r} is not normalized (it reads as {posixpath.normpath(value)!r});"
            f" expected {ACCEPTED}."
        )
    why = _system_why(path)
    return f"{name} = {value!r} {why}; expected {ACCEPTED}." if why else ""


def _system_why(path: str) -> str:
    """Why ``path`` is no place for a deployment ("" when it is one)."""
    if path in SYSTEM_DIRS:
        return "is a system directory"
    for tree in SYSTEM_TREES:
        if path.startswith(tree + "/"):
            return f"lies inside the system directory {tree}"
    return ""


def _os_tree(path: str) -> str:
    """The OS tree ``path`` lies in ("" for none), by its longest matching prefix."""
    if path == "/usr/local" or path.startswith("/usr/local/"):
        return ""
    best = ""
    for tree in OS_TREES:
        if (path == tree or path.startswith(tree + "/")) and len(tree) > len(best):
            best = tree
    return best


def glm5_port_problem(value: Any, name: str, allow_zero: bool = False) -> str:
    """'' when ``value`` is a TCP port (1-65535; 0 too with ``allow_zero``), else one sentence."""
    text = str(value).strip() if value is not None and not isinstance(value, bool) else ""
    low = 0 if allow_zero else 1
    accepted = "a TCP port 1-65535" + (", or 0 for none" if allow_zero else "")
    if not text.isdigit() or not low <= int(text) <= 65535:
        return f"{name} = {value!r} is refused; expected {accepted}."
    return ""


def _whole(value: Any) -> int | None:
    """``value`` as an int when it is one (an int, or the digits of one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def glm5_tp_problem(value: Any, name: str, heads: Any, gpu_count: Any = None) -> str:
    """'' when ``value`` is a usable tensor-parallel size, else one sentence.

    Usable: a whole number >= 1 that divides the model's ``heads`` attention heads and,
    when ``gpu_count`` is a GPU count (1 or more; None or anything else: not checked here,
    glm5_gpu_count has its own line), is at most the host's GPU count.
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
    gpus = _whole(gpu_count)
    if gpus is not None and gpus >= 1 and int(text) > gpus:
        return f"{name} = {shown} exceeds glm5_gpu_count {gpus}; expected at most the host's GPU count."
    return ""


def _mask(url: str) -> str:
    """``url`` with its user information (a proxy's password) replaced."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", url)


def glm5_url_problem(value: Any, name: str, kind: str = "proxy", allow_empty: bool = True) -> str:
    """'' when ``value`` parses as a ``kind`` URL (proxy, index or url), else one sentence.

    proxy: scheme http, https, socks5 or socks5h, a host, an optional port 1-65535, no
    path. index (a package index) and url (any other download, e.g. a repository's key):
    http(s) with a host (optional port, any path), or file:///path. User information
    (user:password@) is never printed.
    """
    schemes = PROXY_SCHEMES if kind == "proxy" else INDEX_SCHEMES
    accepted = (
        "a proxy URL scheme://host[:port] (scheme " + ", ".join(schemes) + ")"
        if kind == "proxy"
        else ("an index URL" if kind == "index" else "a URL") + " http(s)://host[:port]/path or file:///path"
    )
    if value is None or value == "":
        return "" if allow_empty else f"{name} is empty; expected {accepted}."
    if not isinstance(value, str):
        return f"{name} = {value!r} is not a string; expected {accepted}."
    shown = repr(_mask(value))
    why = ""
    if any(ch.isspace() or ord(ch) < 32 for ch in value):
        why = "it contains a space or a control character"
    else:
        parts = urlsplit(value)
        scheme = parts.scheme.lower()
        if "://" not in value or not scheme:
            why = "it has no scheme://"
        elif scheme not in schemes:
            why = f"scheme {scheme} is not one of " + ", ".join(schemes)
        elif scheme == "file":
            if parts.netloc or not parts.path.startswith("/"):
                why = "a file: URL has no host and an absolute path (file:///path)"
        elif not parts.hostname:
            why = "it has no host"
        else:
            try:
                port = parts.port
            except ValueError:
                port = -1
            if port == -1 or port == 0:
                why = "its port is not 1-65535"
            elif kind == "proxy" and (parts.path not in ("", "/") or parts.query or parts.fragment):
                why = "a proxy URL has no path"
    return f"{name} = {shown} is refused: {why}; expected {accepted}." if why else ""


# --- argument specs -------------------------------------------------------------


def _load_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)


def glm5_spec_inputs(role_path: str, entry: str = "main") -> dict[str, Any]:
    """What glm5_spec_refusals needs of a role, read on the controller.

    options: the options of ``entry`` in meta/argument_specs.yml; aliases: {option: the
    shared glm5_ variable its default is exactly ("{{ glm5_x }}")}; names: the options and
    the aliases, the variables whose values the check reads (in this order); unset: the
    value that stands for an undefined variable.
    """
    role = Path(role_path)
    spec = _load_yaml(role / "meta" / "argument_specs.yml") or {}
    options = ((spec.get("argument_specs") or {}).get(entry) or {}).get("options") or {}
    defaults: dict[str, Any] = {}
    main = role / "defaults" / "main.yml"
    files = [main] if main.is_file() else sorted((role / "defaults" / "main").glob("*.yml"))
    for name in files:
        defaults.update(_load_yaml(name) or {})
    aliases: dict[str, str] = {}
    for option in options:
        raw = defaults.get(option)
        match = re.fullmatch(r"\{\{\s*(glm5_[a-z0-9_]+)\s*\}\}", raw.strip()) if isinstance(raw, str) else None
        if match and match.group(1) != option:
            aliases[option] = match.group(1)
    names = list(options) + sorted(set(aliases.values()) - set(options))
    return {"options": options, "aliases": aliases, "names": names, "unset": UNSET}


def _int_problem(value: Any) -> str:
    if isinstance(value, bool):
        return "a whole number (not a boolean)"
    if isinstance(value, int):
        return ""
    if isinstance(value, float):
        return f"a whole number ({int(value)})" if value.is_integer() else "a whole number"
    if isinstance(value, str):
        if INT_TEXT.match(value):
            return ""
        if INT_TEXT.match(value.strip()):
            return f"a whole number without spaces ({value.strip()})"
        return "a whole number"
    return "a whole number"


def _float_problem(value: Any) -> str:
    if isinstance(value, bool):
        return "a number (not a boolean)"
    if isinstance(value, (int, float)):
        return ""
    if isinstance(value, str) and FLOAT_TEXT.match(value):
        return ""
    return "a number without spaces (e.g. 0.92)" if isinstance(value, str) and FLOAT_TEXT.match(value.strip()) \
        else "a number (e.g. 0.92)"


def _bool_problem(value: Any) -> str:
    if isinstance(value, bool):
        return ""
    if isinstance(value, int) and value in (0, 1):
        return ""
    if isinstance(value, str) and value.lower() in BOOL_WORDS:
        return ""
    return "true or false"


def _str_problem(value: Any) -> str:
    if isinstance(value, bool):
        return "a string (YAML reads an unquoted yes/no/true/false/on/off as a boolean: quote it)"
    if isinstance(value, (str, int, float)):
        return ""
    return "a string"


TYPE_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
              "path": "a path", "list": "a list", "dict": "a mapping"}
TYPE_RULES = {"int": _int_problem, "float": _float_problem, "bool": _bool_problem, "str": _str_problem,
              "path": _str_problem}


def _value_problem(value: Any, option: dict[str, Any]) -> str:
    """The accepted form when ``value`` does not fit ``option`` (type, elements, choices), else ''."""
    kind = option.get("type", "str")
    if kind in TYPE_RULES:
        form = TYPE_RULES[kind](value)
    elif kind == "list":
        if not isinstance(value, list):
            return "a list (YAML: [a, b], one item per entry)"
        element = {"type": option.get("elements", "raw")}
        bad = [item for item in value if _value_problem(item, element)]
        if bad:
            return "a list of " + _value_problem(bad[0], element).split(" (")[0] + " items (" + \
                ", ".join(_shown(item, 40) for item in bad) + " is not)"
        form = ""
    elif kind == "dict":
        form = "" if isinstance(value, dict) else "a mapping (YAML: {key: value})"
    else:
        form = ""
    if form:
        return form
    choices = option.get("choices")
    if choices:
        if kind == "int":
            ok = int(value) in [int(c) for c in choices]
        elif kind == "bool":
            ok = True
        else:
            ok = str(value) in [str(c) for c in choices]
        if not ok:
            return "one of " + ", ".join(str(c) for c in choices)
    return ""


def glm5_spec_refusals(inputs: dict[str, Any], values: list[Any]) -> list[str]:
    """One line per option of ``inputs`` (glm5_spec_inputs) whose value does not fit its spec.

    ``values`` are the variables' values in the order of inputs["names"] (UNSET where
    undefined). An option whose value equals the shared glm5_ variable its default names
    is shown as "option (glm5_variable)"; a secret option (no_log) as "the value".
    """
    named = dict(zip(inputs["names"], values, strict=True))
    lines: list[str] = []
    for option, spec in inputs["options"].items():
        value = named.get(option, UNSET)
        if isinstance(value, str) and value == UNSET:
            continue
        spec = spec or {}
        alias = inputs["aliases"].get(option)
        label = f"{option} ({alias})" if alias and named.get(alias, UNSET) == value else option
        if value is None:
            if spec.get("default") is None or spec.get("type", "str") == "raw":
                continue
            form = TYPE_WORDS.get(spec.get("type", "str"), "a value")
            lines.append(f"{label} is null (an empty YAML value); expected {form} (\"\" or [] where empty means none).")
            continue
        problem = _value_problem(value, spec)
        if not problem:
            continue
        if spec.get("no_log"):
            lines.append(f"{label}: the value is refused; expected {problem}.")
        else:
            lines.append(f"{label} = {_shown(value)} is refused; expected {problem}.")
    return lines


# --- the refusal lines ---------------------------------------------------------


def _subjects(line: str) -> set[str]:
    """The variables a refusal line is about: its first word and the shared glm5_ setting
    in parentheses after it ("vllm_service_port (glm5_api_port) = 0 ..." -> both)."""
    match = SUBJECT.match(line)
    if not match:
        return set()
    return {name for name in match.groups() if name}


def glm5_refusals(checks: Any, previous: Any = None) -> list[str]:
    """The messages of the failed checks.

    ``checks`` is a list of strings (a failed check's message; "" for a check that
    passed) or of lists of such strings (a check over several values), as a role's
    tasks/validate.yml builds it. ``previous``: the lines earlier roles added; a line
    about a variable one of them is already about (its own name or the shared glm5_
    setting it comes from) is left out: one line per bad value, not one per role that
    reads it. Several lines of one call about one variable (two bad items of a list)
    are kept.
    """
    if not isinstance(checks, list):
        raise TypeError(f"glm5_refusals expects a list of messages, got {type(checks).__name__}")
    before = [str(line) for line in previous or []]
    refused: set[str] = set()
    for line in before:
        refused |= _subjects(line)
    out: list[str] = []
    for check in checks:
        items = check if isinstance(check, list) else [check]
        for item in items:
            text = "" if item is None else str(item).strip()
            if not text or text in out or text in before or _subjects(text) & refused:
                continue
            out.append(text)
    return out


# --- what the host answers (module glm5_host_probe) -------------------------------


def glm5_host_items(items: Any) -> list[dict[str, Any]]:
    """The items of a role's host checks whose value passed its own rule.

    A path item ({kind: path, name, var, value, writes}) is kept when glm5_path_problem
    accepts it and it is set; its value is then normalized (no trailing '/'), ``raw``
    keeping what was written. A pem item ({kind: pem, name, value}) likewise. A port item
    ({kind: port, name, value, service, ...}) when glm5_port_problem accepts it.
    """
    out: list[dict[str, Any]] = []
    for item in items or []:
        kind = item.get("kind")
        value = item.get("value")
        if kind in ("path", "pem"):
            if value in (None, "") or glm5_path_problem(value, "x"):
                continue
            # A file's name with a trailing '/' is not the file: only a path item is normalized.
            out.append({**item, "raw": value, "value": glm5_normpath(value) if kind == "path" else value})
        elif kind == "port":
            if glm5_port_problem(value, "x"):
                continue
            out.append({**item, "value": int(str(value).strip())})
    return out


def _holder(entry: dict[str, Any]) -> str:
    command = str(entry.get("command") or "")
    if len(command) > 80:
        command = command[:77] + "..."
    unit = entry.get("unit") or ""
    if entry.get("pid") is None:
        return unit or f"a process of uid {entry.get('uid')} (its process cannot be read)"
    where = f"pid {entry['pid']}" + (f", {unit}" if unit else "")
    return f"'{command}' ({where})" if command else f"pid {entry['pid']}" + (f" ({unit})" if unit else "")


def glm5_host_refusals(items: Any, probe: Any, seeds: Any = None, ssh_extra: Any = None) -> list[str]:
    """The refusal lines of the host checks, from the answers of module glm5_host_probe.

    Paths: the path rule again on the path as the host resolves it (symbolic links
    followed), and for a path a deployment writes, no link from outside an OS tree (/etc,
    /usr, ...) into it. CA bundles: a file that OpenSSL loads with at least one
    certificate. Ports, the first that applies: SSH's port; below the host's privileged
    range for a service that runs without privileges; the port of another service of
    this project (``seeds``: the project's ports this run does not check itself); held by
    a process other than the service's own unit (or ``own_units``: the same service's
    units under another name, e.g. vllm-<old name>.service after a rename).
    """
    probe = probe or {}
    lines: list[str] = []
    paths = probe.get("paths") or {}
    pem = probe.get("pem") or {}
    listeners = probe.get("listeners") or {}
    ssh = {int(k): v for k, v in (probe.get("ssh_ports") or {}).items()}
    for port, why in (ssh_extra or {}).items():
        ssh.setdefault(int(port), why)
    start = int(probe.get("unprivileged_port_start", 1024))
    glob_units = set(probe.get("glob_units") or [])
    port_items = [i for i in items or [] if i.get("kind") == "port"]
    others = [s for s in glm5_host_items(seeds or []) if s.get("kind") == "port"]
    # One line per path, CA bundle, and service's port, whichever roles ask about it.
    reported: set[tuple[str, str, str]] = set()
    for item in items or []:
        kind = item.get("kind")
        name = item.get("name", "?")
        value = item.get("value")
        key = (str(kind), str(item.get("service")) if kind == "port" else "", str(value))
        if key in reported:
            continue
        if kind != "port":
            reported.add(key)
        if kind == "path":
            resolved = (paths.get(value) or {}).get("realpath", value)
            if resolved == value:
                continue
            why = _system_why(resolved).replace("is a system", "a system").replace("lies inside", "inside")
            if not why and item.get("writes"):
                tree = _os_tree(resolved)
                if tree and OS_TREES[tree] != OS_TREES.get(_os_tree(value), ""):
                    why = f"inside the system directory {tree}"
            if why:
                lines.append(f"{name} = {item.get('raw', value)!r} resolves on this host to {resolved!r}"
                             f" (through a symbolic link), {why}; expected {ACCEPTED_RESOLVED}.")
        elif kind == "pem":
            answer = pem.get(value) or {}
            accepted = "a file of PEM certificates (-----BEGIN CERTIFICATE-----) on this host"
            shown = repr(item.get("raw", value))
            if not answer.get("exists"):
                lines.append(f"{name} = {shown} does not exist on this host; expected {accepted}.")
            elif not answer.get("is_file"):
                lines.append(f"{name} = {shown} is not a file; expected {accepted}.")
            elif answer.get("error") or int(answer.get("certificates", 0)) < 1:
                why = answer.get("error") or "no certificate in it"
                lines.append(f"{name} = {shown} does not load as a CA bundle ({why}); expected {accepted}.")
        elif kind == "port":
            line = _port_line(item, ssh, start, port_items, others, listeners, glob_units)
            if line:
                reported.add(key)
                lines.append(line)
    return lines


SERVICE_ORDER = ("api", "tls_proxy", "gpu_exporter", "router", "router_prometheus")


def _rank(service: Any) -> int:
    return SERVICE_ORDER.index(service) if service in SERVICE_ORDER else len(SERVICE_ORDER)


def _port_line(item: dict[str, Any], ssh: dict[int, str], start: int, items: list[dict[str, Any]],
               seeds: list[dict[str, Any]], listeners: dict[str, Any], glob_units: set[str]) -> str:
    name, port, service = item.get("name", "?"), int(item["value"]), item.get("service")
    label = item.get("label") or service
    if port in ssh:
        return f"{name} = {port} is SSH's port ({ssh[port]}); expected another port (SSH must stay reachable)."
    if not item.get("privileged") and port < start:
        return (f"{name} = {port} is a privileged port (below {start} on this host) and {label} runs without"
                f" privileges (no CAP_NET_BIND_SERVICE); expected {start}-65535.")
    checked = {i.get("service") for i in items}
    for other in items + [s for s in seeds if s.get("service") not in checked]:
        if other.get("service") == service or int(other["value"]) != port:
            continue
        if other in seeds or _rank(other.get("service")) < _rank(service):
            # The other setting by the name a user sets: its shared glm5_ variable, if any.
            other_name = re.sub(r"^.*\((glm5_[a-z0-9_]+)\)$", r"\1", str(other.get("name")))
            return (f"{name} = {port} is also the port of {other.get('label') or other.get('service')}"
                    f" ({other_name}); expected a port of its own.")
    unit = item.get("unit") or ""
    if not unit:
        return ""
    own = {unit} | ({u for u in glob_units if re.fullmatch(item.get("own_units", "(?!)"), u)})
    held = [e for e in listeners.get(str(port), []) if e.get("unit") not in own]
    if not held:
        return ""
    return (f"{name} = {port} is in use by " + ", ".join(_holder(e) for e in held)
            + f", not by {unit}; expected a free port or the service's own.")


def glm5_host_normalized(items: Any) -> list[dict[str, str]]:
    """[{var, value, name, raw}] for every checked path variable written with a trailing '/'.

    An item's ``shared`` variable (the glm5_ setting its value came from, given with
    ``shared_value``) is listed too when it holds the same spelling.
    """
    out: list[dict[str, str]] = []
    for item in items or []:
        if item.get("kind") != "path" or not item.get("var") or item.get("raw") == item.get("value"):
            continue
        shared = item.get("shared") if item.get("shared_value") == item["raw"] else None
        names = [item["var"]] + ([shared] if shared else [])
        for var in names:
            entry = {"var": var, "value": item["value"], "name": item.get("name", var), "raw": item["raw"]}
            if all(e["var"] != var for e in out):
                out.append(entry)
    return out


def glm5_host_unnormalized(entries: Any, current: Any) -> list[str]:
    """Lines for the entries of glm5_host_normalized whose variable still holds the
    spelling with '/' after the set_fact (``current``: their values now, in order): the
    value comes from the command line (-e), which ranks above any fact of the run."""
    lines: list[str] = []
    for entry, now in zip(entries or [], current or [], strict=False):
        if now != entry["value"]:
            lines.append(
                f"{entry['var']} = {entry['raw']!r} is given on the command line (-e), where the run cannot take it"
                f" as the same path without the trailing '/'; expected {entry['value']!r} (in the inventory, a"
                " trailing '/' is dropped)."
            )
    return lines


# --- variables no role declares ------------------------------------------------


SET_FACT = ("set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact")


def _task_names(node: Any, out: set[str]) -> None:
    """The variables a list of tasks or plays sets: register, set_fact keys, vars keys, loop_var."""
    if isinstance(node, list):
        for entry in node:
            _task_names(entry, out)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("register"), str):
        out.add(node["register"])
    for key in SET_FACT:
        if isinstance(node.get(key), dict):
            out.update(str(k) for k in node[key] if k != "cacheable")
    if isinstance(node.get("vars"), dict):
        out.update(str(k) for k in node["vars"])
    loop_var = (node.get("loop_control") or {}).get("loop_var") if isinstance(node.get("loop_control"), dict) else None
    if isinstance(loop_var, str):
        out.add(loop_var)
    for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
        _task_names(node.get(key), out)


def glm5_declared_settings(roles_dir: str) -> dict[str, list[str]]:
    """The variables the project declares, and the role prefixes, read on the controller.

    Declared: the options of every entry point of a role's meta/argument_specs.yml, the
    names its defaults/ and vars/ define, and what the project's tasks and playbooks set
    (facts, registered results, vars). The prefixes are the role names + '_'.
    """
    declared: set[str] = set()
    prefixes: list[str] = []
    roles = Path(roles_dir)
    for path in sorted(roles.iterdir()):
        if not (path / "meta").is_dir():
            continue
        prefixes.append(path.name + "_")
        specs = path / "meta" / "argument_specs.yml"
        if specs.is_file():
            for entry in ((_load_yaml(specs) or {}).get("argument_specs") or {}).values():
                declared.update(((entry or {}).get("options") or {}).keys())
        for sub in ("defaults", "vars"):
            for name in [*(path / sub).glob("*.yml"), *(path / sub / "main").glob("*.yml")]:
                data = _load_yaml(name)
                if isinstance(data, dict):
                    declared.update(str(k) for k in data)
        for sub in ("tasks", "handlers"):
            for name in (path / sub).glob("*.yml"):
                _task_names(_load_yaml(name), declared)
    for name in (roles.parent / "playbooks").glob("*.yml"):
        _task_names(_load_yaml(name), declared)
    return {"prefixes": sorted(prefixes, key=len, reverse=True), "names": sorted(declared)}


def glm5_unknown_settings(names: Any, declared: dict[str, list[str]]) -> list[str]:
    """A warning for each of ``names`` that carries a role's prefix but no role declares.

    The nearest declared variable (of any role) is named when one is close enough.
    """
    known = set(declared["names"])
    out: list[str] = []
    for name in sorted({str(n) for n in names or []}):
        if name in known or "__" in name or not any(name.startswith(p) for p in declared["prefixes"]):
            continue
        near = difflib.get_close_matches(name, declared["names"], n=1, cutoff=0.8)
        hint = f"; did you mean {near[0]}?" if near else "; no role reads it."
        out.append(f"{name} is set, but no role declares it{hint}")
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "glm5_declared_settings": glm5_declared_settings,
            "glm5_host_items": glm5_host_items,
            "glm5_host_normalized": glm5_host_normalized,
            "glm5_host_refusals": glm5_host_refusals,
            "glm5_host_unnormalized": glm5_host_unnormalized,
            "glm5_normpath": glm5_normpath,
            "glm5_path_problem": glm5_path_problem,
            "glm5_port_problem": glm5_port_problem,
            "glm5_refusals": glm5_refusals,
            "glm5_spec_inputs": glm5_spec_inputs,
            "glm5_spec_refusals": glm5_spec_refusals,
            "glm5_tp_problem": glm5_tp_problem,
            "glm5_unknown_settings": glm5_unknown_settings,
            "glm5_url_problem": glm5_url_problem,
        }
