"""Unit tests of the preflight role's filters."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "preflight_filters", ROOT / "roles/preflight/filter_plugins/preflight.py"
)
assert spec and spec.loader
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

MOUNTS = [
    {"mount": "/", "size_available": 10},
    {"mount": "/srv", "size_available": 20},
    {"mount": "/srv/models", "size_available": 30},
    {"mount": "/srv/modelsx", "size_available": 40},
]


@pytest.mark.parametrize(
    ("path", "mount"),
    [
        ("/srv/models/glm-5", "/srv/models"),
        ("/srv/models", "/srv/models"),
        ("/srv/modelsx/a", "/srv/modelsx"),
        ("/srv/other", "/srv"),
        ("/opt/x", "/"),
    ],
)
def test_deepest_parent_mount_wins(path, mount):
    assert mod.mount_for(path, MOUNTS)["mount"] == mount


def test_no_mount_is_an_error():
    with pytest.raises(ValueError, match="no mounted file system"):
        mod.mount_for("/data", [{"mount": "/srv", "size_available": 1}])
