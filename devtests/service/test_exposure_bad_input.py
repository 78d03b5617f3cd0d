"""Bad input to the optional roles around the service (tls_proxy, gpu_exporter) and to
vllm_service behind the proxy is refused, with a clear message, before any task changes
the host; the private key shows in no event. Runner events, check mode on this machine.

The certificates are made here, per test, with cryptography (no key material in the
repository)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert(key: ec.EllipticCurvePrivateKey, days: int, start_days_ago: int = 0) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "devtest.example")])
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=start_days_ago)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture
def pair() -> dict[str, str]:
    key = _key()
    return {"tls_proxy_certificate": _cert(key, 30), "tls_proxy_private_key": _pem_key(key)}


PROXY = {"glm5_tls_proxy": True, "tls_proxy_server_name": "devtest.example"}


def message(event) -> str:
    res = event["event_data"]["res"]
    return str(res.get("msg", "")) + json.dumps(res.get("results", []))


# Every check of a role's tasks/validate.yml adds a line; this task refuses once with them all.
REFUSE = "Refuse the settings that failed a check"


def _refused(run, task: str, text: str) -> None:
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == task
    assert text in message(failure), message(failure)
    assert run.changed_before(failure) == []


def _no_key_anywhere(run, key_pem: str) -> None:
    body = key_pem.splitlines()[1]  # a line of the key's base64, as any leak would carry it
    assert body not in json.dumps(run.events)


def test_proxy_without_certificate(run_local):
    run = run_local("tls_proxy_role.yml", PROXY)
    _refused(run, REFUSE, "tls_proxy_certificate does not hold a PEM certificate")


def test_key_of_another_certificate(run_local, pair):
    other = _pem_key(_key())
    run = run_local("tls_proxy_role.yml", {**PROXY, **pair, "tls_proxy_private_key": other})
    _refused(run, "Refuse a certificate that does not belong to the key, or has expired",
             "does not belong to tls_proxy_private_key")
    _no_key_anywhere(run, other)


def test_expired_certificate(run_local):
    key = _key()
    run = run_local("tls_proxy_role.yml", {**PROXY, "tls_proxy_certificate": _cert(key, 10, start_days_ago=20),
                                           "tls_proxy_private_key": _pem_key(key)})
    _refused(run, "Refuse a certificate that does not belong to the key, or has expired", "has expired")


def test_garbage_key_is_refused_without_showing_it(run_local, pair):
    garbage = ("-----BEGIN PRIVATE KEY-----\n"
               "bm90LWEta2V5LWJ1dC1zZWNyZXQtbWFya2VyLTQyNDI0Mg==\n"
               "-----END PRIVATE KEY-----\n")
    run = run_local("tls_proxy_role.yml", {**PROXY, **pair, "tls_proxy_private_key": garbage})
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"].startswith("Read the public half of the private key")
    assert run.changed_before(failure) == []
    _no_key_anywhere(run, garbage)


@pytest.mark.parametrize(
    ("settings", "text"),
    [
        ({"tls_proxy_port": 8000},
         "tls_proxy_port (glm5_tls_proxy_port) = 8000 is also the port of vLLM's API (glm5_api_port);"
         " expected a port of its own."),
        ({"vllm_service_host": "0.0.0.0"}, "tls_proxy_upstream_host (vllm_service_host) = '0.0.0.0' is refused"),
        ({"vllm_service_host": "10.0.0.5"}, "'10.0.0.5'"),
        ({"tls_proxy_protocols": ["TLSv1.1", "TLSv1.2"]}, "expected TLSv1.2 and/or TLSv1.3"),
        ({"tls_proxy_addresses": ["proxy.example"]}, "tls_proxy_addresses has 'proxy.example'"),
        ({"tls_proxy_server_name": "a b; return 200"}, "tls_proxy_server_name = 'a b; return 200' is refused"),
        ({"glm5_gpu_exporter": True, "glm5_gpu_exporter_port": 8443},
         "= 8443 is also the port of the GPU exporter (glm5_gpu_exporter_port)"),
    ],
    ids=["port-equals-api", "vllm-on-any", "vllm-on-lan", "tls11", "address-not-ip", "server-name", "exporter-port"],
)
def test_proxy_settings_refused(run_local, pair, settings, text):
    run = run_local("tls_proxy_role.yml", {**PROXY, **pair, **settings})
    _refused(run, REFUSE, text)


def test_good_certificate_and_key_pass_validation(run_local, pair):
    run = run_local("tls_proxy_validate.yml", {**PROXY, **pair})
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
    assert "Refuse a certificate that does not belong to the key, or has expired" in run.ok_tasks()
    _no_key_anywhere(run, pair["tls_proxy_private_key"])


def test_unknown_certificate_source_refused_by_argument_specs(run_local, pair):
    run = run_local("tls_proxy_role.yml", {**PROXY, **pair, "tls_proxy_certificate_source": "letsencrypt"})
    assert run.rc != 0
    failure = run.first_failure()
    assert "letsencrypt" in message(failure)
    assert run.changed_before(failure) == []


def test_vllm_on_any_address_behind_the_proxy(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "glm5_tls_proxy": True, "vllm_service_host": "0.0.0.0"})
    _refused(run, REFUSE, "vllm_service_host = '0.0.0.0' is refused while glm5_tls_proxy is on")


@pytest.mark.parametrize(
    ("settings", "text"),
    [
        ({"glm5_gpu_exporter_port": 8000},
         "gpu_exporter_port (glm5_gpu_exporter_port) = 8000 is also the port of vLLM's API (glm5_api_port)"),
        ({"gpu_exporter_nvidia_smi": "nvidia-smi"}, "gpu_exporter_nvidia_smi = 'nvidia-smi' is a relative path"),
        ({"gpu_exporter_address": "localhost"}, "gpu_exporter_address = 'localhost' is refused"),
        ({"glm5_tls_proxy": True, "glm5_gpu_exporter_port": 8443}, "= 8443 is also the port of the TLS proxy"),
    ],
    ids=["api-port", "relative-nvidia-smi", "address-not-ip", "proxy-port"],
)
def test_exporter_settings_refused(run_local, settings, text):
    run = run_local("gpu_exporter_role.yml", {"glm5_gpu_exporter": True, **settings})
    _refused(run, REFUSE, text)


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ({"vllm_service_port": 18777},
         "vllm_service_port = 18777 differs from exposure_api_port (glm5_api_port) = 8000,"
         " the port the firewall opens for the API; expected them equal: set glm5_api_port, which both follow."),
        ({"glm5_api_port": 18777}, None),
        ({"glm5_api_port": 18777, "vllm_service_port": 18777}, None),
        # A bad vllm_service_port is role vllm_service's line, not a second one here.
        ({"vllm_service_port": 70000}, None),
    ],
    ids=["service-port-set-apart", "api-port", "both-equal", "bad-service-port-not-repeated"],
)
def test_firewall_port_follows_the_service_port(run_local, extra, refusal):
    run = run_local("exposure_validate.yml", extra)
    if refusal is None:
        failed = [e["event_data"]["res"].get("msg") for e in run.task_events() if e["event"] == "runner_on_failed"]
        assert run.rc == 0, failed
        return
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == "Refuse the settings that failed a check"
    assert str(failure["event_data"]["res"]["msg"]).splitlines() == [refusal]
