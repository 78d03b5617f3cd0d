"""A crash-looping router fails role vllm_router's readiness wait at once, naming why:
the role (the real vllm-router 0.1.17 from its hashed lock, through the development
host's CA bundle and uv cache, as scenario fleet installs it) through ansible-runner
against a systemd test container, with an argument this vllm-router does not know
(vllm_router_extra_args: a flag of another version, an operator's typo). vllm-router
exits at its start, systemd restarts it every RestartSec (2 s) under Restart=on-failure,
and the wait (role glm5's tasks/unit_wait.yml, module glm5_unit_wait) must fail within
one start interval of the first crash, long before its timeout (600 s here), with
vllm-router's own error line, instead of printing "no answer" until the timeout.

The backend is this host itself (the role's default backends: group gpu_servers); nothing
listens there, which does not matter: the router never gets as far as looking.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_container import WAIT_ROUND, crash_times, playbook_runner, start_container

CA = os.environ.get("GLM5_TEST_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
UV_CACHE = os.environ.get("GLM5_TEST_UV_CACHE", "/var/cache/glm5-test/uv")
UNIT = "glm5-vllm-router.service"
PLAY = """---
- name: Role vllm_router alone (its install, unit, start and readiness wait)
  hosts: gpu_servers
  gather_facts: false
  become: true
  roles:
    - role: vllm_router
"""
ROUTER_VARS: dict[str, Any] = {
    # the mounts of the container below, as scenario fleet's router has them
    "glm5_ca_bundle": "/opt/glm5-test/ca.crt",
    "vllm_router_uv_cache_dir": "/var/cache/glm5-test/uv",
    "vllm_router_api_key": "devtest-key-not-a-secret",
    "vllm_router_extra_args": ["--glm5-no-such-flag"],
    # Only the crash can end the wait early: its timeout is far beyond the test's bound.
    "vllm_router_ready_timeout": 600,
}


@pytest.fixture(scope="module")
def router_host() -> Iterator[str]:
    Path(UV_CACHE).mkdir(parents=True, exist_ok=True)
    volumes = [f"{CA}:/opt/glm5-test/ca.crt:ro", f"{UV_CACHE}:/var/cache/glm5-test/uv:rw"]
    yield from start_container("glm5-router", volumes)


def test_a_router_that_exits_at_its_start_fails_the_wait_at_once(router_host: str, tmp_path: Path) -> None:
    play = tmp_path / "router.yml"
    play.write_text(PLAY)
    began = time.monotonic()
    result = playbook_runner(router_host, tmp_path)(str(play), ROUTER_VARS)
    took = time.monotonic() - began
    assert result.rc != 0
    failure = result.first_failure()
    assert failure["event_data"]["task"] == WAIT_ROUND, (failure["event_data"]["task"], result.failure_message())
    message = result.failure_message()
    # Restarting (RestartSec), restarted since the wait began, or failed once systemd's
    # start limit is hit: each is the crash loop, named with the unit's state.
    assert re.match(rf"{re.escape(UNIT)} (is restarting after a crash \(exit-code\)|was restarted \d+ time|failed)",
                    message), message
    assert "vllm-router: error: unrecognized arguments: --glm5-no-such-flag" in message, message
    crash_to_failure = result.failed_at() - crash_times(router_host, UNIT)[0]
    assert 0 <= crash_to_failure < 30, f"the run failed {crash_to_failure:.1f} s after the router's first crash"
    print(f"router crash loop: the run failed {crash_to_failure:.1f} s after the first crash (run: {took:.0f} s):"
          f"\n{message}")  # shown with -s
