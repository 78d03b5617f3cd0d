"""The glm5_vllm_patchset module against copies of the real pinned vLLM files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from sitecopy import (
    INSTALLED,
    MODULE,
    PATCH_DIR,
    UNPATCHED,
    added,
    make_site,
    originals,
    pristine,
    snapshot,
    targets,
)

pytestmark = pytest.mark.skipif(INSTALLED is None, reason="needs .venv-ml (pinned vLLM)")
KILLHOOK = Path(__file__).resolve().parent / "killhook"
MANIFEST = "vllm/.glm5-patchset.json"


def module_run(
    tmp_path: Path, site: Path, env: dict[str, str] | None = None, **params: Any
) -> subprocess.CompletedProcess[str]:
    args: dict[str, Any] = {
        "site_packages": str(site),
        "patch_dir": str(PATCH_DIR),
        "patchset_version": "0.20.2",
        "python": sys.executable,
    }
    args.update(params)
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    return subprocess.run([sys.executable, str(MODULE), str(argfile)], capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})


def module(tmp_path: Path, site: Path, **params: Any) -> dict[str, Any]:
    proc = module_run(tmp_path, site, **params)
    return dict(json.loads(proc.stdout))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The snapshot of a site the module converged without any fault."""
    tmp = tmp_path_factory.mktemp("reference")
    site = make_site(tmp / "site")
    assert module(tmp, site)["changed"]
    return files(site)


def files(site: Path) -> dict[str, str]:
    """The site's snapshot without the bytecode caches."""
    return {k: v for k, v in snapshot(site).items() if "__pycache__" not in k}


def tamper(path: Path, extra: bytes = b"import os  # edited on the host\n") -> None:
    """A line appended, the file's times put back (ctime still moves)."""
    st = path.stat()
    path.write_bytes(path.read_bytes() + extra)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_applies_detects_and_reverses(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    first = module(tmp_path, site)
    assert first["changed"] and len(first["applied"]) == len(list(PATCH_DIR.glob("*.patch"))), first
    assert not pristine(site)
    manifest = json.loads((site / "vllm" / ".glm5-patchset.json").read_text())
    assert manifest["patchset_version"] == manifest["vllm_version"] == "0.20.2"
    assert sorted(manifest["files"]) == targets()
    assert sorted(manifest["patches"]) == sorted(p.name for p in PATCH_DIR.glob("*.patch"))
    for rel in targets():  # byte-compiled by the venv's python
        pyc = list((site / rel).parent.glob(f"__pycache__/{Path(rel).stem}.*.pyc"))
        assert pyc, rel

    again = module(tmp_path, site)
    assert again["changed"] is False and again["applied"] == []

    check = module(tmp_path, site, state="absent", _ansible_check_mode=True)
    assert check["changed"] and not pristine(site)

    gone = module(tmp_path, site, state="absent")
    assert gone["changed"] and pristine(site)
    assert not (site / "vllm" / ".glm5-patchset.json").exists()
    assert module(tmp_path, site, state="absent")["changed"] is False


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    before = snapshot(site)
    result = module(tmp_path, site, _ansible_check_mode=True)
    assert result["changed"] and snapshot(site) == before


def test_stale_manifest_is_rewritten(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    path = site / "vllm" / ".glm5-patchset.json"
    path.write_text('{"patchset_version": "old"}')
    result = module(tmp_path, site)
    assert result["changed"] and result["applied"] == []
    assert json.loads(path.read_text())["patchset_version"] == "0.20.2"


def test_reinstalled_tree_is_patched_again(tmp_path: Path) -> None:
    """A vLLM reinstall leaves pristine files under a stale manifest."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    for rel in targets():
        if rel in added():
            (site / rel).unlink()
        else:
            (site / rel).write_bytes((INSTALLED / rel).read_bytes())  # type: ignore[operator]
    result = module(tmp_path, site)
    assert result["changed"] and len(result["applied"]) == len(list(PATCH_DIR.glob("*.patch"))) and not pristine(site)


def test_wrong_version_refused_untouched(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", version="0.20.1")
    before = snapshot(site)
    result = module(tmp_path, site)
    assert result.get("failed")
    assert "0.20.1" in result["msg"] and "0.20.2" in result["msg"]
    assert snapshot(site) == before


def test_conflict_leaves_no_half_patched_tree(tmp_path: Path) -> None:
    """deepseek_v2.py is not the wheel's (0004 could not apply to it) and no original
    is at hand: refused naming the file, no patch applied to any file."""
    site = make_site(tmp_path / "site")
    deepseek = site / "vllm/model_executor/models/deepseek_v2.py"
    text = deepseek.read_text()
    deepseek.write_text(text.replace('self.is_v32 = hasattr(config, "index_topk")', "X = 1"))
    before = snapshot(site)
    result = module(tmp_path, site)
    assert result.get("failed") and result["unobtainable"] == ["vllm/model_executor/models/deepseek_v2.py"], result
    assert str(deepseek) in result["msg"] and "nothing was changed" in result["msg"]
    assert snapshot(site) == before


def test_edited_patched_file_is_never_blessed(tmp_path: Path) -> None:
    """A patched file edited on the host (a line appended, its mtime put back): the run
    must not keep the edit under a manifest rewritten with the edited file's sha256.
    Without an original at hand it refuses, naming the file, and changes nothing."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    edited = site / "vllm/model_executor/models/deepseek_v2.py"
    manifest_before = (site / MANIFEST).read_bytes()
    tamper(edited)
    before = snapshot(site)
    result = module(tmp_path, site)
    assert json.loads(manifest_before)["files"][str(edited.relative_to(site))] != hashlib.sha256(
        edited.read_bytes()).hexdigest()
    assert (site / MANIFEST).read_bytes() == manifest_before, "the manifest was rewritten from the edited file"
    assert result.get("failed"), result
    assert result["msg"].count("\n") == 0 and str(edited) in result["msg"]
    assert snapshot(site) == before


def test_edited_patched_file_is_repaired_from_the_wheel(tmp_path: Path, reference: dict[str, str]) -> None:
    """With the uv cache ml_env installed from: restored from the wheel's file, patched
    again, reported as repaired; the manifest is what the wheel and the set make it."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    edited = site / "vllm/model_executor/models/deepseek_v2.py"
    tamper(edited)
    cache = originals(tmp_path / "uv-cache")
    result = module(tmp_path, site, sources=[str(tmp_path / "nowhere"), str(cache)])
    assert result["changed"] and result["repaired"] == ["vllm/model_executor/models/deepseek_v2.py"], result
    assert result["applied"] == sorted({n for n, t in _parts(edited.relative_to(site))})
    assert files(site) == reference
    again = module(tmp_path, site, sources=[str(cache)])
    assert again["changed"] is False and again["repaired"] == []


def _parts(rel: Path) -> list[tuple[str, str]]:
    return [(p.name, str(rel)) for p in sorted(PATCH_DIR.glob("*.patch")) if f"+++ b/{rel}" in p.read_text()]


def test_missing_and_truncated_files_restored(tmp_path: Path, reference: dict[str, str]) -> None:
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    gone, cut = site / targets()[0], site / targets()[1]
    gone.unlink()
    cut.write_bytes(cut.read_bytes()[:100])
    result = module(tmp_path, site, sources=[str(originals(tmp_path / "cache"))])
    assert result["changed"] and result["repaired"] == sorted(targets()[:2]), result
    assert files(site) == reference


def test_source_disagreeing_with_the_record_is_not_used(tmp_path: Path) -> None:
    """An original whose bytes or whose own RECORD do not carry the installed RECORD's
    digest is no original: refused, nothing changed."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    tamper(site / targets()[0])
    cache = originals(tmp_path / "cache")
    tamper(cache / "archive-v0" / "test-entry" / targets()[0], b"# another build\n")
    before = snapshot(site)
    result = module(tmp_path, site, sources=[str(cache)])
    assert result.get("failed") and result["unobtainable"] == [targets()[0]], result
    assert snapshot(site) == before


def test_wheel_file_as_source(tmp_path: Path, reference: dict[str, str]) -> None:
    """An offline bundle's wheels/ directory: the file is read from the .whl (a zip
    holding the real wheel's files and RECORD)."""
    assert INSTALLED is not None
    wheels = tmp_path / "bundle" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "vllm-0.20.2-cp38-abi3-manylinux_2_35_x86_64.whl", "w") as whl:
        for rel in [*targets(), *UNPATCHED, "vllm-0.20.2.dist-info/RECORD"]:
            if (INSTALLED / rel).exists():
                whl.write(INSTALLED / rel, rel)
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    tamper(site / targets()[-1])
    result = module(tmp_path, site, sources=[str(wheels)])
    assert result["repaired"] == [targets()[-1]], result
    assert files(site) == reference


def test_unpatched_vllm_file_checked_against_the_record(tmp_path: Path) -> None:
    """A file of vLLM the set does not touch: verify=python checks it (restored), the
    .py files by sha256, the others by size; verify=patched does not look."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    envs = site / "vllm/envs.py"
    pristine_envs = envs.read_bytes()
    tamper(envs)
    assert module(tmp_path, site, verify="patched")["changed"] is False
    refused = module(tmp_path, site)
    assert refused.get("failed") and refused["unobtainable"] == ["vllm/envs.py"], refused
    assert "differs from vLLM 0.20.2's wheel (RECORD" in refused["msg"]
    result = module(tmp_path, site, sources=[str(originals(tmp_path / "cache"))])
    assert result["changed"] and result["repaired"] == ["vllm/envs.py"] and result["applied"] == []
    assert envs.read_bytes() == pristine_envs
    typed = site / "vllm/py.typed"
    typed.write_bytes(typed.read_bytes() + b"x")  # not .py: caught by its size
    assert module(tmp_path, site, sources=[str(originals(tmp_path / "cache"))])["repaired"] == ["vllm/py.typed"]


def test_absent_restores_an_edited_file_from_the_wheel(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    tamper(site / targets()[2])
    gone = module(tmp_path, site, state="absent", sources=[str(originals(tmp_path / "cache"))])
    assert gone["changed"] and gone["repaired"] == [targets()[2]] and pristine(site), gone
    assert not (site / MANIFEST).exists()


def test_a_file_the_set_adds(tmp_path: Path, reference: dict[str, str]) -> None:
    """A file a patch creates (not in the wheel): written from the set; edited, written
    again from the set with no source needed (named as repaired); removed when the set is
    reversed; its manifest entry has no wheel's digest."""
    (rel,) = added()
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    assert (site / rel).is_file()
    assert json.loads((site / MANIFEST).read_text())["pristine"][rel] is None
    tamper(site / rel)
    result = module(tmp_path, site)
    assert result["changed"] and result["repaired"] == [rel], result
    assert files(site) == reference
    gone = module(tmp_path, site, state="absent")
    assert gone["changed"] and pristine(site) and not (site / rel).exists(), gone


def test_split_patch_covers_every_line() -> None:
    """Each patch cut per file: the files it names, and together exactly its diff (from
    its first file header on), so reversing a file's parts alone is that file's share
    of the patch, nothing more or less."""
    sys.path.insert(0, str(MODULE.parent))
    try:
        import glm5_vllm_patchset as mod
    finally:
        sys.path.pop(0)
    for patch in sorted(PATCH_DIR.glob("*.patch")):
        text = patch.read_text()
        parts = mod.split_patch(text)
        assert sorted(parts) == mod.patch_targets(patch), patch.name
        assert "".join(parts.values()) == text[text.index("\n--- ") + 1:], patch.name
    # A hunk line that looks like a file header is read as part of its hunk.
    tricky = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n--- a/y.py\n+++ b/y.py\n"
    assert mod.split_patch(tricky) == {"x.py": tricky}


# Kill points: before the first file is replaced (its temporary file written), with
# half of the files replaced, at the byte-compile step (all files new, none compiled,
# no manifest), and with the files compiled and the manifest about to be written.
KILLS = ["rename:1", f"rename:{len(targets()) // 2}", "spawn:py_compile", f"rename:{len(targets()) + 1}"]


@pytest.mark.parametrize("kill", KILLS)
def test_sigkill_while_applying_then_rerun_converges(tmp_path: Path, kill: str, reference: dict[str, str]) -> None:
    """The module is killed (SIGKILL, by the kernel, at an exact point) while it applies
    the set; the next run converges to the same tree and manifest as an uninterrupted one."""
    site = make_site(tmp_path / "site")
    mark = tmp_path / "killed"
    killed = module_run(tmp_path, site, env={"PYTHONPATH": str(KILLHOOK), "GLM5_KILL_AT": kill,
                                             "GLM5_KILL_UNDER": f"{site}/", "GLM5_KILL_MARK": str(mark)})
    assert killed.returncode == -9 and mark.exists(), (killed.returncode, killed.stderr[-500:])
    assert not (site / MANIFEST).exists()
    again = module(tmp_path, site)
    assert again["changed"] and not again.get("failed"), again
    assert files(site) == reference
    assert all(list((site / rel).parent.glob(f"__pycache__/{Path(rel).stem}.*.pyc")) for rel in targets())
    assert module(tmp_path, site)["changed"] is False
