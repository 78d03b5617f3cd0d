"""docs/architecture.md is the project's map: it must stay true as the tree changes.

Every path of the repository it names must exist, and every role and playbook must be
on it. A path inside a role may be written from the role's folder (`tasks/apt.yml` in a
sentence about role glm5: it must exist in some role) or from `roles/`
(`vllm_service/tasks/model_files.yml`). A token that starts with a variable
(`glm5_model_dir/base`: variables carry a role's name as prefix) and absolute paths are
the managed host's and are not checked. Every role has the README the map promises.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
ROLE_PARTS = {
    "action_plugins",
    "defaults",
    "files",
    "filter_plugins",
    "handlers",
    "library",
    "meta",
    "module_utils",
    "tasks",
    "templates",
    "vars",
}
# top-level folders whose paths are recognised outside backticks too
TOP = ("docs", "devtests", "src", "tools", "roles", "playbooks", "molecule", "scripts", "files", "tests", "inventory")
PLACEHOLDER = re.compile(r"[<>*{}]|NNNN|\.\.\.")


def repo_paths(text: str) -> set[str]:
    """The repository paths the text names: backticked tokens with a `/` that are not
    absolute, and bare tokens that start with a top-level folder."""
    found: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        token = span.strip()
        if " " in token or "/" not in token or token.startswith("/") or "://" in token:
            continue
        found.add(token)
    bare = re.compile(r"(?<![\w./`-])((?:" + "|".join(TOP) + r")/[\w./-]*[\w/])")
    for m in bare.finditer(re.sub(r"`[^`\n]+`", "", text)):
        found.add(m.group(1))
    return {p.rstrip(".,;:") for p in found if not PLACEHOLDER.search(p)}


def resolves(path: str, root: Path = ROOT) -> bool:
    if (root / path).exists():
        return True
    first = path.split("/", 1)[0]
    roles = [r for r in (root / "roles").iterdir() if r.is_dir()]
    if first in ROLE_PARTS:
        return any((role / path).exists() for role in roles)
    if first in {r.name for r in roles}:
        return (root / "roles" / path).exists()
    # a host path under a variable's value, e.g. glm5_model_dir/base
    return any(first.startswith(f"{r.name}_") for r in roles)


def test_every_path_the_map_names_exists() -> None:
    paths = repo_paths(MAP.read_text(encoding="utf-8"))
    assert len(paths) > 30, f"the parser found only {sorted(paths)}"
    missing = sorted(p for p in paths if not resolves(p))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_role_and_playbook_is_on_the_map() -> None:
    text = MAP.read_text(encoding="utf-8")
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    playbooks = sorted(p.name for p in (ROOT / "playbooks").glob("*.yml"))
    assert roles and playbooks
    assert [r for r in roles if f"roles/{r}/" not in text] == []
    assert [p for p in playbooks if f"playbooks/{p}" not in text] == []


def test_every_role_has_a_readme() -> None:
    roles = [p for p in (ROOT / "roles").iterdir() if p.is_dir()]
    assert [r.name for r in roles if not (r / "README.md").is_file()] == []


def test_the_parser_can_fail(tmp_path: Path) -> None:
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "tasks" / "a.yml").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("")
    text = (
        "`roles/r/tasks/a.yml`, `tasks/a.yml`, `r/tasks/a.yml`, `r_dir/x`, docs/x.md and `docs/gone.md`; "
        "`tasks/b.yml`, `r/tasks/b.yml`, `q_dir/x`; not paths: `/etc/glm5`, `roles/<role>/`, `a b/c`, "
        "`https://example.org/x`; bare docs/missing.md."
    )
    paths = repo_paths(text)
    fine = {"roles/r/tasks/a.yml", "tasks/a.yml", "r/tasks/a.yml", "r_dir/x", "docs/x.md"}
    wrong = {"docs/gone.md", "docs/missing.md", "tasks/b.yml", "r/tasks/b.yml", "q_dir/x"}
    assert paths == fine | wrong
    assert {p for p in paths if not resolves(p, tmp_path)} == wrong
