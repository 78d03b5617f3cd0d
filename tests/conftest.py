"""Shared fixtures of the post-deploy suite (pytest-testinfra).

How the suite gets its settings: from the same inventory the playbooks use, through
testinfra's ansible backend. ``host.ansible("ansible.builtin.debug", "var=NAME")``
makes Ansible itself template the variable, so vault-backed values
(``vllm_service_api_key: "{{ vault_vllm_api_key }}"``) resolve exactly as they do for
the playbook; pass ``--ask-vault-pass`` or set ANSIBLE_VAULT_PASSWORD_FILE as for
ansible-playbook. Run it as::

    pytest tests/ --hosts=ansible://gpu_servers --ansible-inventory=inventory/production/hosts.yml

Environment overrides (no inventory at hand): GLM5_VLLM_API_KEY, GLM5_SERVED_MODEL_NAME,
GLM5_VLLM_HOST, GLM5_VLLM_PORT, GLM5_GPU_REQUIRED.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pytest


def ansible_var(host: Any, name: str, default: Any = None) -> Any:
    """The templated value of an inventory variable for ``host`` (vault included)."""
    try:
        res = host.ansible("ansible.builtin.debug", f"var={name}", check=False)
    except Exception:  # not the ansible backend (e.g. --hosts=local://)
        return default
    value = res.get(name, default) if isinstance(res, dict) else default
    if isinstance(value, str) and ("VARIABLE IS NOT DEFINED" in value or "{{" in value or value.startswith("<< error")):
        return default
    return value


def _bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in {"1", "true", "yes"}


@dataclass(frozen=True)
class Service:
    """What the suite needs to know about the deployed service."""

    name: str
    unit: str
    host: str
    port: int
    api_key: str
    gpu_required: bool
    # The unit runs vllm_probe_standin (the test double of `vllm serve` in the
    # molecule containers), which serves no model and no vLLM metrics.
    standin: bool

    @property
    def url_host(self) -> str:
        return "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host

    @property
    def base_url(self) -> str:
        return f"http://{self.url_host}:{self.port}"


@pytest.fixture(scope="module")
def service(host: Any) -> Service:
    name = os.environ.get("GLM5_SERVED_MODEL_NAME") or ansible_var(
        host, "vllm_service_served_model_name", None
    ) or ansible_var(host, "glm5_served_model_name", "glm-5")
    key = os.environ.get("GLM5_VLLM_API_KEY") or ansible_var(host, "vllm_service_api_key", "")
    gpu = os.environ.get("GLM5_GPU_REQUIRED")
    unit_file = host.file(f"/etc/systemd/system/vllm-{name}.service")
    return Service(
        name=str(name),
        unit=f"vllm-{name}",
        host=os.environ.get("GLM5_VLLM_HOST") or str(ansible_var(host, "vllm_service_host", "127.0.0.1")),
        port=int(os.environ.get("GLM5_VLLM_PORT") or ansible_var(host, "vllm_service_port", 8000)),
        api_key=str(key),
        gpu_required=_bool(gpu if gpu is not None else ansible_var(host, "glm5_gpu_required", True)),
        standin=unit_file.exists and "vllm_probe_standin" in unit_file.content_string,
    )


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


_GET = (
    "import sys,urllib.request,urllib.error\n"
    "r=urllib.request.Request(sys.argv[1])\n"
    "k=sys.stdin.read().strip()\n"
    "k and r.add_header('Authorization','Bearer '+k)\n"
    "try:\n"
    " a=urllib.request.urlopen(r,timeout=30);print(a.status);print(a.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    " print(e.code);print(e.read().decode())\n"
)


@pytest.fixture(scope="module")
def http_get(host: Any):
    """GET a URL *on the managed host* (the API may listen on loopback only).

    The key travels on stdin, so it shows in no process list.
    """

    def _get(path: str, service: Service, with_key: bool = True) -> HttpAnswer:
        key = service.api_key if with_key else ""
        cmd = host.run(
            f"printf %s {_shq(key)} | python3 -c {_shq(_GET)} {_shq(service.base_url + path)}"
        )
        assert cmd.rc == 0, cmd.stderr
        status, _, body = cmd.stdout.partition("\n")
        return HttpAnswer(int(status), body)

    return _get


def _shq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
