"""Role tls_proxy's self-signed source, run for real (not check mode) on this machine into a
temporary directory: an ECDSA key (0640), a certificate naming the server and loopback,
nothing changed on a second run, and a new certificate once the old one is inside the
renewal window."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import ansible_runner
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "tls_proxy_certificate.yml"


@pytest.fixture
def run_cert(tmp_path: Path):
    def _run(**extra) -> Run:
        (tmp_path / "runner").mkdir(exist_ok=True)
        inventory = {"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
        result = ansible_runner.run(
            private_data_dir=str(tmp_path / "runner"),
            playbook=str(PLAYBOOK),
            inventory=inventory,
            extravars={"glm5_gpu_required": False, "tls_proxy_certificate_source": "self_signed",
                       "tls_proxy_server_name": "gpu-node-1.example", "tls_proxy_config_dir": str(tmp_path / "tls"),
                       "tls_proxy_group": "root", **extra},
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                     "ANSIBLE_CACHE_PLUGIN": "memory",
                     "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
            quiet=True,
        )
        return Run(rc=result.rc, events=list(result.events))

    (tmp_path / "tls").mkdir()
    return _run


def _changed(run: Run) -> list[str]:
    return [e["event_data"]["task"] for e in run.task_events() if e["event_data"].get("res", {}).get("changed")]


def _cert(tmp_path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((tmp_path / "tls" / "tls.crt").read_bytes())


def test_self_signed_made_named_and_stable(run_cert, tmp_path):
    first = run_cert()
    assert first.rc == 0, [e["event_data"].get("res", {}).get("msg") for e in first.task_events()
                           if e["event"] == "runner_on_failed"]
    key_file = tmp_path / "tls" / "tls.key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o640"
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    cert = _cert(tmp_path)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gpu-node-1.example", "localhost"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 364 <= days <= 366
    second = run_cert()
    assert second.rc == 0
    assert _changed(second) == [], _changed(second)
    assert _cert(tmp_path).serial_number == cert.serial_number


def test_renewed_inside_the_window(run_cert, tmp_path):
    assert run_cert(tls_proxy_self_signed_days=10).rc == 0
    old = _cert(tmp_path)
    # Valid 10 days, renewal window 30 days: the next run replaces it.
    run = run_cert(tls_proxy_self_signed_days=365)
    assert run.rc == 0
    assert "The self-signed certificate (renewed when it expires within the renewal window)" in _changed(run)
    new = _cert(tmp_path)
    assert new.serial_number != old.serial_number
    assert new.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=300)
