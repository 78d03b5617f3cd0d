"""Shared fixtures of the post-deploy suite (pytest-testinfra).

How the suite gets its settings: from the same inventory the playbooks use, through
testinfra's ansible backend. ``host.ansible("ansible.builtin.debug", "var=NAME")``
makes Ansible itself template the variable, so vault-backed values
(``vllm_service_api_key: "{{ vault_vllm_api_key }}"``) resolve exactly as they do for
the playbook; pass ``--ask-vault-pass`` or set ANSIBLE_VAULT_PASSWORD_FILE as for
ansible-playbook. Run it as::

    pytest tests/ --hosts=ansible://gpu_servers --ansible-inventory=inventory/production/hosts.yml

Environment overrides (no inventory at hand): GLM5_VLLM_API_KEY, GLM5_SERVED_MODEL_NAME,
GLM5_VLLM_HOST, GLM5_VLLM_PORT, GLM5_GPU_REQUIRED; for the optional TLS proxy and GPU
exporter GLM5_TLS_PROXY, GLM5_TLS_PROXY_PORT, GLM5_GPU_EXPORTER (true/false), and
GLM5_TLS_PROXY_CA (a CA file on the host that signed the proxy's certificate).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Role glm5's one derivation of the service's and the proxy's addresses, the very code
# the playbooks template glm5_api_endpoints with.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "roles" / "glm5" / "filter_plugins"))
from glm5_endpoints import glm5_endpoints, url_host


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
        return str(glm5_endpoints(self.host, self.port)["api_host"])

    @property
    def base_url(self) -> str:
        return str(glm5_endpoints(self.host, self.port)["api_url"])


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
        port=int(os.environ.get("GLM5_VLLM_PORT") or ansible_var(host, "vllm_service_port", None)
                 or ansible_var(host, "glm5_api_port", 8000)),
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


@dataclass(frozen=True)
class TlsProxy:
    """The TLS reverse proxy (role tls_proxy) as the inventory configures it."""

    enabled: bool
    port: int
    server_name: str
    self_signed: bool
    max_body: int
    mask_distro_nginx: bool
    address: str = "127.0.0.1"
    unit: str = "glm5-tls-proxy"
    config_dir: str = "/etc/glm5/tls-proxy"

    @property
    def certificate(self) -> str:
        return f"{self.config_dir}/tls.crt"

    @property
    def ca_args(self) -> str:
        """curl's trust: a self-signed certificate is its own CA; else GLM5_TLS_PROXY_CA or the system store."""
        ca = self.certificate if self.self_signed else os.environ.get("GLM5_TLS_PROXY_CA", "")
        return f"--cacert {_shq(ca)}" if ca else ""

    def curl(self, path: str, extra: str = "") -> str:
        """curl arguments for ``path`` through the proxy, checked against the server name, sent to the
        proxy's (first) listen address on this host."""
        host = self.server_name
        to = f"[{self.address}]" if ":" in self.address else self.address
        return (f"curl -sS {self.ca_args} --resolve {_shq(f'{host}:{self.port}:{to}')} {extra} "
                f"{_shq(f'https://{host}:{self.port}{path}')}")


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = str(text).strip().lower()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


@pytest.fixture(scope="module")
def tls_proxy(host: Any) -> TlsProxy:
    env = os.environ.get("GLM5_TLS_PROXY")
    unit = host.file("/etc/systemd/system/glm5-tls-proxy.service")
    enabled = _bool(env) if env is not None else _bool(ansible_var(host, "glm5_tls_proxy", unit.exists))
    return TlsProxy(
        enabled=enabled,
        port=int(os.environ.get("GLM5_TLS_PROXY_PORT") or ansible_var(host, "tls_proxy_port", None)
                 or ansible_var(host, "glm5_tls_proxy_port", 8443)),
        server_name=str(ansible_var(host, "tls_proxy_server_name", None) or host.backend.get_hostname()),
        self_signed=ansible_var(host, "tls_proxy_certificate_source", "content") == "self_signed",
        max_body=_size(ansible_var(host, "tls_proxy_client_max_body_size", "16m")),
        mask_distro_nginx=_bool(ansible_var(host, "tls_proxy_mask_distro_nginx", True)),
        address=url_host((ansible_var(host, "tls_proxy_addresses", None) or ["0.0.0.0"])[0]).strip("[]"),
    )


@dataclass(frozen=True)
class GpuExporter:
    """The GPU exporter (role gpu_exporter), read from its deployed unit."""

    enabled: bool
    address: str
    port: int
    nvidia_smi: str
    unit: str = "glm5-gpu-exporter"
    script: str = "/usr/local/libexec/glm5/glm5_gpu_exporter.py"

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(self.address, self.address)
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{self.port}/metrics"

    @property
    def double(self) -> bool:
        """It runs fake_nvidia_smi, molecule's test double of nvidia-smi (no GPU there)."""
        return "fake_nvidia_smi" in self.nvidia_smi


@pytest.fixture(scope="module")
def gpu_exporter(host: Any) -> GpuExporter:
    env = os.environ.get("GLM5_GPU_EXPORTER")
    unit = host.file("/etc/systemd/system/glm5-gpu-exporter.service")
    enabled = _bool(env) if env is not None else _bool(ansible_var(host, "glm5_gpu_exporter", unit.exists))
    args: dict[str, str] = {}
    if unit.exists:
        exec_line = next((ln for ln in unit.content_string.splitlines() if ln.startswith("ExecStart=")), "")
        words = shlex.split(exec_line.removeprefix("ExecStart="))
        args = {w[2:]: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    return GpuExporter(
        enabled=enabled,
        address=args.get("listen-address", "0.0.0.0"),
        port=int(args.get("port", 9835)),
        nvidia_smi=args.get("nvidia-smi", "/usr/bin/nvidia-smi"),
    )
