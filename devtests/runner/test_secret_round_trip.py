"""The API key reaches the service exactly, and never the log.

Role vllm_service alone against the systemd test container, with the stand-in of vLLM
(src/glm5_tools/probe/standin.py: a TEST DOUBLE of `vllm serve`, no GPU here) that
checks the Bearer key against VLLM_API_KEY as vLLM does. For each key of the table the
running unit's /proc/<MainPID>/environ holds VLLM_API_KEY equal to the key byte for
byte, a request with the key gets 200 and one with another key 401. A key with a
newline is refused in validate.yml before any change; a key outside printable ASCII
too (vLLM compares the header as latin-1 text, HTTP clients send ASCII: such a key
could never authenticate). Failing runs at -vvv never show the key.

Failing first: with the old env file line (VLLM_API_KEY={{ key }}) the backslash,
leading-# and newline rows failed (see test_systemd_quote_parser.py for the parser
evidence); the -vvv leak came from Ansible's environment: keyword (fixed in role model,
playbooks/verify.yml and playbooks/diagnose.yml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
PORT = 18800
FIXTURE = "/opt/glm5-rt"
# Two units (each a full role run, the slow part of this test) cover the table: $ \ " ' %
# # ; space, $NAME/${NAME}/$$, a literal "\n", % specifiers, backquotes, keys that start
# like a comment (; and #) and end with a quote or a backslash, 200 characters.
# Non-ASCII text goes through the same filter in UNICODE_ENV below (an API key cannot be
# non-ASCII: see the refusals).
KEYS = [
    ";a$HOME ${B} $$ \\ \\n ' % %i %% # `c` ~\"",
    "#" + ("$\\\"'%#; x" * 22)[:198] + "\\",
]
# Not the API key, but the same env path: non-ASCII text through the unit's Environment=.
UNICODE_ENV = {"GLM5_RT_TEXT": "ünïcödé ✓ 鍵 🔑 $HOME \\ \" %i"}
CONFIG = {"num_attention_heads": 64, "index_topk": 2048, "num_hidden_layers": 78, "kv_lora_rank": 512,
          "qk_rope_head_dim": 64, "index_head_dim": 128, "max_position_embeddings": 202752}


def _sh(container: str, script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", "-i", container, "sh", "-c", script], input=stdin,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def prepared(container: str) -> dict[str, Any]:
    """The stand-in and a placeholder model on the container (what molecule's prepare does)."""
    standin = (ROOT / "src/glm5_tools/probe/standin.py").read_text()
    base, gguf = f"{FIXTURE}/model/base", f"{FIXTURE}/model/gguf"
    script = (f"mkdir -p {base} {gguf} && cat > {FIXTURE}/standin.py && "
              f"echo GGUF placeholder > {gguf}/m-00001-of-00001.gguf && "
              f"echo '{json.dumps(CONFIG)}' > {base}/config.json && chmod -R a+rX {FIXTURE}")
    assert _sh(container, script, standin).returncode == 0
    return {
        "glm5_gpu_required": False,
        "vllm_service_command": ["/usr/bin/python3", f"{FIXTURE}/standin.py", "serve"],
        "vllm_service_validate_args": False,
        "vllm_service_ready_timeout": 120,
        "vllm_service_gguf_path": f"{gguf}/m-00001-of-00001.gguf",
        "vllm_service_tokenizer_dir": base,
        "vllm_service_hf_config_dir": base,
        "vllm_service_chat_template": "",
        "vllm_service_environment": UNICODE_ENV,
    }


def _plays(tmp: Path, indices: list[int], prefix: str) -> str:
    """A playbook of one play per key (handlers are per play; in an include_role loop they
    would restart the last item's unit). Keys stay in extravars, never in the file."""
    plays = [{
        "name": f"Role vllm_service for key {n}", "hosts": "all", "gather_facts": False,
        "vars": {"vllm_service_served_model_name": f"{prefix}-{n}",
                 "vllm_service_port": "{{ round_trip_port | int + " + str(n) + " }}",
                 "vllm_service_api_key": "{{ round_trip_keys[" + str(n) + "] }}"},
        "roles": ["vllm_service"],
    } for n in indices]
    path = tmp / f"{prefix}.yml"
    path.write_text(json.dumps(plays))
    return str(path)


def _run(container: str, tmp: Path, playbook: str, extravars: dict[str, Any], verbosity: int = 0) -> tuple[Run, str]:
    inventory = {"all": {"children": {"gpu_servers": {"hosts": {container: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}}}}
    result = ansible_runner.run(
        private_data_dir=str(tmp), playbook=playbook if playbook.startswith("/") else str(ROOT / playbook),
        inventory=inventory, extravars=extravars,
        verbosity=verbosity, quiet=True,
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                 "ANSIBLE_CACHE_PLUGIN": "memory",
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
    )
    stdout = result.stdout.read() if result.stdout else ""
    return Run(rc=result.rc, events=list(result.events)), stdout


def _environ(container: str, unit: str) -> dict[bytes, bytes]:
    pid = _sh(container, f"systemctl show -p MainPID --value {unit}").stdout.strip()
    raw = subprocess.run(["docker", "exec", container, "cat", f"/proc/{pid}/environ"],
                         capture_output=True, check=True).stdout
    return dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)


def _status(container: str, port: int, key: str) -> int:
    """GET /v1/models with the key (read from stdin; urllib sends the header as latin-1, ASCII here)."""
    code = ("import sys, urllib.request, urllib.error\n"
            f"r = urllib.request.Request('http://127.0.0.1:{port}/v1/models', headers={{'Authorization': "
            "'Bearer ' + sys.stdin.read()})\n"
            "try:\n    print(urllib.request.urlopen(r).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    out = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", code], input=key,
                         capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


@pytest.fixture(scope="module")
def deployed(container: str, prepared: dict[str, Any], tmp_path_factory) -> dict[int, dict[str, Any]]:
    """Each key deployed in turn under its own served name (rt-<n>), what its unit holds and
    answers read right after its run: a host serves one name, and the run for rt-1 replaces
    the unit of rt-0 (role vllm_service's old_units.yml). rt-1's unit stays for the -vvv
    cases below."""
    seen: dict[int, dict[str, Any]] = {}
    for n, key in enumerate(KEYS):
        tmp = tmp_path_factory.mktemp(f"rt{n}")
        run, _ = _run(container, tmp, _plays(tmp, [n], "rt"),
                      {**prepared, "round_trip_keys": KEYS, "round_trip_port": PORT})
        failed = [e["event_data"]["res"].get("msg") for e in run.task_events() if e["event"] == "runner_on_failed"]
        assert run.rc == 0, failed
        seen[n] = {
            "environ": _environ(container, f"vllm-rt-{n}.service"),
            "own key": _status(container, PORT + n, key),
            "other key": _status(container, PORT + n, KEYS[(n + 1) % len(KEYS)]),
            "units": _sh(container, "ls /etc/systemd/system").stdout.split(),
        }
    return seen


@pytest.mark.parametrize("index", range(len(KEYS)))
def test_environ_equals_key_and_request_gets_200(deployed, index):
    key, seen = KEYS[index], deployed[index]
    env = seen["environ"]
    assert env[b"VLLM_API_KEY"] == key.encode("utf-8")
    assert env[b"GLM5_RT_TEXT"] == UNICODE_ENV["GLM5_RT_TEXT"].encode("utf-8")
    assert "GLM5_INJECTED" not in str(env)
    assert seen["own key"] == 200
    assert seen["other key"] == 401
    # one unit at a time: the run for this name replaced the one before
    units = [u for u in seen["units"] if u.startswith("vllm-rt-") and u.endswith(".service")]
    assert units == [f"vllm-rt-{index}.service"]


def _refused_before_change(run: Run, task: str) -> str:
    failure = run.first_failure()
    assert failure["event_data"]["task"] == task
    assert run.changed_before(failure) == []
    return failure["event_data"]["res"].get("msg", "")


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("rt-FIRSTHALF\nGLM5_INJECTED=pwned-SECONDHALF", "contains a newline at character 13 of 43"),
        ("rt-FIRSTHALF\x00SECONDHALF", "contains a NUL character"),
        ("rt-FIRSTHALF-schlüssel-SECONDHALF", "outside printable ASCII (U+00FC)"),
        (" rt-FIRSTHALF-SECONDHALF", "starts or ends with a space"),
    ],
    ids=["newline", "nul", "non-ascii", "leading-space"],
)
def test_unrepresentable_key_refused_before_change_and_never_shown(container, prepared, tmp_path, key, problem):
    run, stdout = _run(container, tmp_path, _plays(tmp_path, [0], "rtbad"),
                       {**prepared, "round_trip_keys": [key], "round_trip_port": PORT + 50}, verbosity=3)
    assert run.rc != 0
    # The check is one entry of role vllm_service's validate.yml list; the role's last
    # validate task refuses with every line.
    msg = _refused_before_change(run, "Refuse the settings that failed a check")
    assert problem in msg and "vllm_service_api_key" in msg and "printable ASCII" in msg
    assert _sh(container, "test ! -e /etc/glm5/vllm-rtbad-0.env && "
                          "test ! -e /etc/systemd/system/vllm-rtbad-0.service").returncode == 0
    for part in ("FIRSTHALF", "SECONDHALF", "GLM5_INJECTED"):
        assert part not in stdout, f"{part!r} of the key in the -vvv output"
        assert part not in json.dumps(run.events), f"{part!r} of the key in the runner events"


@pytest.mark.parametrize(
    ("key", "port", "task"),
    [(KEYS[0], PORT + 1, "/v1/models lists the served name"),
     # verify.yml imports the validation phase first (playbooks/validate.yml, role
     # vllm_service's checks): the key is refused there, before the play's own assert.
     ("rt-FIRSTHALF\nGLM5_INJECTED=pwned-SECONDHALF", PORT,
      "Refuse the run (one line per bad value; nothing was changed)")],
    ids=["other-unit's-key", "newline-key"],
)
def test_failing_key_request_at_vvv_never_shows_the_key(container, deployed, tmp_path, key, port, task):
    """playbooks/verify.yml with a key the unit does not take: rt-0's key on rt-1's unit
    and port (its no_log /v1/models task fails with 401), and a key with a newline. Failing first
    for the latter: verify.yml sent it, Python's HTTP client refused the header naming
    its value, and ansible-core 2.19 printed that error ("[ERROR]: Task failed: ...
    Invalid header value b'Bearer ...'") despite no_log (the leak). Now refused
    before any request. -vvv shows no part of either key."""
    run, stdout = _run(container, tmp_path, "playbooks/verify.yml",
                       # The unit that owns the port: the validation phase refuses a port
                       # another unit listens on.
                       {"glm5_gpu_required": False, "vllm_service_served_model_name": f"rt-{port - PORT}",
                        "vllm_service_port": port, "vllm_service_api_key": key}, verbosity=3)
    assert run.rc != 0
    assert run.first_failure()["event_data"]["task"] == task
    events = json.dumps(run.events)
    for secret in {key, KEYS[port - PORT]}:
        for part in [secret, json.dumps(secret)[1:-1], *secret.split("\n")]:
            assert part not in stdout and part not in events, f"{part[:12]!r}... of a key in the -vvv output"
