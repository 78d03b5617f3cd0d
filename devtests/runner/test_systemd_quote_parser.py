"""The quoting filters of role glm5 against systemd's own parser (the test container's
systemd 257): a unit whose ExecStart=, Environment= and EnvironmentFile= carry every
value of the table, quoted by the filters, is started; the program it runs writes the
argv and environment it received. Each must equal the value given, byte for byte.

Failing first: with the unit's old quoting (Environment="K={{ v | replace('%','%%') |
replace('"','\\\\"') }}", ExecStart words through shell quoting, VLLM_API_KEY={{ v }} in
the env file) the ExecStart words were split, merged and "$HOME" expanded, and the
backslash and leading-space rows of both environments came back changed
(test_old_quoting_changes_values below keeps that evidence)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from shlex import quote as shell_quote

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles/glm5/filter_plugins"))

import glm5_systemd_quote as q  # noqa: E402

VALUES = [
    "plain",
    "with space",
    "  leading and trailing  ",
    'double"quote',
    "single'quote",
    "back\\slash",
    "trailing backslash\\",
    "\\\\two",
    "\\n not a newline",
    "$HOME",
    "${HOME}x",
    "$$",
    "%n %% % %i",
    "#hash",
    ";semi;colon",
    ";",
    "`tick`",
    "tab\there",
    "=equals=",
    "ünïcödé ✓ 鍵 🔑",
    "k" * 200,
    "",
    "mixed $ \\ \" ' % # ; end",
]
DUMP = (
    "import json, os, sys\n"
    "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k.startswith('Q')}},\n"
    "          open('/root/quote-dump.json', 'w'))\n"
)


def _exec(container: str, *argv: str, stdin: str | None = None) -> str:
    return subprocess.run(["docker", "exec", "-i", container, *argv], input=stdin, check=True,
                          capture_output=True, text=True).stdout


def _run_unit(container: str, unit: str, env_file: str, strict: bool = True) -> dict:
    _exec(container, "sh", "-c", "cat > /root/quote-dump.py", stdin=DUMP)
    _exec(container, "sh", "-c", "cat > /root/quote.env", stdin=env_file)
    _exec(container, "sh", "-c", "cat > /etc/systemd/system/glm5-quote.service", stdin=unit)
    _exec(container, "rm", "-f", "/root/quote-dump.json")
    verify = subprocess.run(["docker", "exec", container, "systemd-analyze", "verify",
                             "/etc/systemd/system/glm5-quote.service"], capture_output=True, text=True)
    if strict:
        assert "glm5-quote.service:" not in verify.stderr, verify.stderr
    _exec(container, "systemctl", "daemon-reload")
    started = subprocess.run(["docker", "exec", container, "systemctl", "start", "glm5-quote.service"],
                             capture_output=True, text=True)
    if strict:
        assert started.returncode == 0, started.stderr
    dump = subprocess.run(["docker", "exec", container, "cat", "/root/quote-dump.json"],
                          capture_output=True, text=True)
    got = json.loads(dump.stdout) if dump.returncode == 0 else {"argv": None, "env": {}}
    got["verify"] = verify.stderr
    return got


def _unit(exec_line: str, environment: list[str]) -> str:
    return ("[Service]\nType=oneshot\n" + "".join(f"Environment={w}\n" for w in environment)
            + "EnvironmentFile=/root/quote.env\n" + f"ExecStart={exec_line}\n")


def test_systemd_reads_back_every_value(container):
    env_file = "# comment\n" + "".join(q.env_file_line(f"QF{i}", v) + "\n" for i, v in enumerate(VALUES))
    environment = [q.unit_environment(f"QE{i}", v) for i, v in enumerate(VALUES)]
    exec_line = q.exec_args(["/usr/bin/python3", "/root/quote-dump.py", *VALUES])
    got = _run_unit(container, _unit(exec_line, environment), env_file)
    assert got["argv"] == VALUES
    for i, v in enumerate(VALUES):
        assert got["env"][f"QF{i}"] == v, (i, v)
        assert got["env"][f"QE{i}"] == v, (i, v)
    assert len(got["env"]) == 2 * len(VALUES)


def test_program_path_with_space_and_percent_and_a_prefix(container):
    """The program word quoted too, also behind the "+" prefix (vLLM's ExecStartPre=+)."""
    _exec(container, "sh", "-c", "mkdir -p '/root/a dir%' && ln -sf /usr/bin/python3 '/root/a dir%/py 3' "
                                 "&& rm -f '/root/pre ran'")
    unit = _unit(q.exec_args(["/root/a dir%/py 3", "/root/quote-dump.py", "x"]), []).replace(
        "ExecStart=", "ExecStartPre=+" + q.exec_args(["/usr/bin/touch", "/root/pre ran"]) + "\nExecStart=")
    got = _run_unit(container, unit, "")
    assert got["argv"] == ["x"]
    _exec(container, "test", "-e", "/root/pre ran")


def test_old_quoting_changes_values(container):
    """Evidence for the change: the templates' quoting before it (kept here as it was)."""
    env_file = "".join(f"QF{i}={v}\n" for i, v in enumerate(VALUES))
    environment = ['"QE{}={}"'.format(i, v.replace("%", "%%").replace('"', '\\"')) for i, v in enumerate(VALUES)]
    words = ["/usr/bin/python3", "/root/quote-dump.py", *VALUES]
    exec_line = " ".join(shell_quote(w).replace("%", "%%") for w in words)
    got = _run_unit(container, _unit(exec_line, environment), env_file, strict=False)
    changed_env_file = [v for i, v in enumerate(VALUES) if got["env"].get(f"QF{i}") != v]
    changed_environment = [v for i, v in enumerate(VALUES) if got["env"].get(f"QE{i}") != v]
    print(json.dumps({"env_file": changed_env_file, "environment": changed_environment,
                      "argv": got["argv"], "verify": got["verify"]}, ensure_ascii=False))
    # Seen on systemd 257: shell quoting in ExecStart splits and merges words ("\\s",
    # "\\n" are C escapes to systemd; "$HOME" is expanded), Environment= drops or
    # changes the backslash rows, the unquoted env file strips spaces and eats backslashes.
    assert got["argv"] != VALUES and "Unbalanced quoting" in got["verify"]
    assert {"back\\slash", "trailing backslash\\", "\\n not a newline"} <= set(changed_environment)
    assert {"  leading and trailing  ", "back\\slash", "\\\\two"} <= set(changed_env_file)


@pytest.mark.parametrize("bad", ["a\nQINJECTED=1", "a\x00b", "\udcff"])
def test_unrepresentable_never_reaches_a_file(bad):
    with pytest.raises(q.AnsibleFilterError):
        q.env_file_line("QK", bad)
