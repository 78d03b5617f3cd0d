"""Fixtures for driving the playbooks through ansible-runner against a real
systemd test container (the molecule test image), and reading the events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_container import playbook_runner, start_container


@pytest.fixture(scope="session")
def container() -> Iterator[str]:
    yield from start_container("glm5-runner")


@pytest.fixture
def run_playbook(container: str, tmp_path: Path):
    return playbook_runner(container, tmp_path)
