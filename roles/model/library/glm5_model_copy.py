#!/usr/bin/python
"""Ansible module: copy the model files a manifest lists from a local directory into the
model directory, writing a progress file while it copies.

Role model's local source (a mounted directory, an offline bundle's model/): ~400 GB,
so the role runs this module in the background (async) and prints its progress every
round (role glm5's follow.yml). A file is copied when the target is missing or differs
from the source in size or mtime (the comparison ansible.builtin.copy makes first); it
is written beside the target and renamed into place, with the source's mtime, the given
owner, group and mode. Whether its bytes are right is the verification's question
(glm5_model_verify, against the manifest), not this module's.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_model_manifest import leaves_root, parse_manifest
from ansible.module_utils.glm5_progress import count, human_bytes, human_seconds, write_atomic

DOCUMENTATION = r"""
module: glm5_model_copy
short_description: Copy the files of a model manifest from a local directory, with a progress file
description:
  - Copies each file the manifest lists (paths relative to I(src)) to the same path under
    I(dest) when it is missing there or differs in size or mtime; the source's mtime is kept.
  - I(plan_only=true) copies nothing and returns C(to_copy) (a quick first look, so that a
    run with nothing to copy needs no background job).
options:
  src: {description: The local model directory., type: path, required: true}
  dest: {description: The model directory., type: path, required: true}
  manifest: {description: Its manifest (sha256sum lines or a JSON list)., type: path, required: true}
  owner: {description: Owner of the copies., type: str, required: true}
  group: {description: Group of the copies., type: str, required: true}
  mode: {description: Mode of the copies (octal); directories add x to each r., type: str, default: "0640"}
  progress: {description: Progress file written while copying ("" = none)., type: path, default: ""}
  interval: {description: Seconds between writes of the progress file., type: float, default: 5}
  plan_only: {description: Copy nothing (see above)., type: bool, default: false}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_model_copy:
    src: /mnt/models/glm-5
    dest: /srv/models/glm-5
    manifest: /mnt/models/glm-5/SHA256SUMS
    owner: root
    group: vllm
"""

RETURN = r"""
to_copy: {description: Files (relative paths) that differ or are missing., type: list, returned: always}
copied: {description: Files copied., type: list, returned: always}
line: {description: One sentence that says what was done., type: str, returned: always}
"""

CHUNK = 16 << 20


def differs(src: Path, dest: Path) -> bool:
    try:
        d = dest.stat()
    except OSError:
        return True
    s = src.stat()
    return (s.st_size, s.st_mtime_ns) != (d.st_size, d.st_mtime_ns)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "manifest": {"type": "path", "required": True},
            "owner": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
            "mode": {"type": "str", "default": "0640"},
            "progress": {"type": "path", "default": ""},
            "interval": {"type": "float", "default": 5},
            "plan_only": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    src, dest = Path(p["src"]), Path(p["dest"])
    try:
        rels = [e["path"] for e in parse_manifest(Path(p["manifest"]).read_text())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg=f"cannot read the manifest {p['manifest']}: {exc}")
    bad = [r for r in rels if leaves_root(r)]
    missing = [r for r in rels if r not in bad and not (src / r).is_file()]
    if bad or missing:
        module.fail_json(msg="model_local_dir: " + "; ".join(
            [f"{r}: path leaves the directory" for r in bad] + [f"{src / r}: missing" for r in missing][:20]))
    to_copy = [r for r in rels if differs(src / r, dest / r)]
    sizes = {r: (src / r).stat().st_size for r in to_copy}
    if p["plan_only"] or not to_copy or module.check_mode:
        line = (f"all {count(len(rels), 'file')} in place already" if not to_copy else
                f"{count(len(to_copy), 'file')} of {len(rels)} to copy ({human_bytes(sum(sizes.values()))})")
        module.exit_json(changed=bool(to_copy) and not p["plan_only"], to_copy=to_copy, copied=[], line=line)
    uid, gid = pwd.getpwnam(p["owner"]).pw_uid, grp.getgrnam(p["group"]).gr_gid
    mode = int(p["mode"], 8)
    dir_mode = mode | ((mode & 0o444) >> 2)
    started = time.time()
    last = 0.0
    doc: dict[str, Any] = {"what": f"copy from {src}", "files_total": len(to_copy), "files_done": 0,
                           "bytes_total": sum(sizes.values()), "bytes_done": 0, "current": [], "done": False,
                           "pid": os.getpid()}

    def report(force: bool = False) -> None:
        nonlocal last
        now = time.time()
        if not p["progress"] or (not force and now - last < max(0.2, p["interval"])):
            return
        last = now
        doc.update(updated=now, elapsed=now - started, rate=doc["bytes_done"] / max(now - started, 1e-9))
        write_atomic(p["progress"], doc)

    copied: list[str] = []
    for rel in to_copy:
        source, target = src / rel, dest / rel
        for parent in reversed(target.relative_to(dest).parents[:-1]):
            d = dest / parent
            if not d.is_dir():
                d.mkdir(mode=dir_mode)
                os.chown(d, uid, gid)
                d.chmod(dir_mode)
        tmp = target.with_name(f".{target.name}.glm5-copy")
        doc["current"] = [{"path": rel, "bytes": 0, "size": sizes[rel]}]
        with source.open("rb") as fin, tmp.open("wb") as fout:
            while chunk := fin.read(CHUNK):
                fout.write(chunk)
                doc["bytes_done"] += len(chunk)
                doc["current"][0]["bytes"] += len(chunk)
                report()
        shutil.copystat(source, tmp)
        os.chown(tmp, uid, gid)
        tmp.chmod(mode)
        tmp.replace(target)
        copied.append(rel)
        doc["files_done"] += 1
    doc.update(current=[], done=True)
    report(force=True)
    elapsed = time.time() - started
    module.exit_json(changed=True, to_copy=to_copy, copied=copied,
                     line=(f"{count(len(copied), 'file')} ({human_bytes(doc['bytes_done'])}) copied in"
                           f" {human_seconds(elapsed)}; {len(rels) - len(copied)} in place already"))


if __name__ == "__main__":
    main()
