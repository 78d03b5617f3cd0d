"""``python -m glm5_tools.slicebench COMMAND ...`` (docs/validation/serving-slice.md).

- ``drive``: profiler captures against a running server (drive.py)
- ``classify TRACE... [--markdown F] [--json F]``: ms per step by class (classify.py)
- ``collect --slice-manifest F --machine F --bench-dir D... --profile-dir D --variant V ...``:
  results.json, profile.md and row.md in --out (collect.py)
- ``project results.json [--markdown F] [--json F]``: the 8x RTX PRO 6000 projection
- ``pins LOCK NAME... [--python 3.12]``: pip requirement lines with the lock's hashes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glm5_tools.slicebench import classify, collect, drive, payload, project


def _write(path: Path | None, text: str) -> None:
    if path is None:
        sys.stdout.write(text)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_tools.slicebench")
    sub = ap.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("drive", help="profiler captures against a running server")
    d.add_argument("--url", required=True)
    d.add_argument("--key-file", type=Path, required=True)
    d.add_argument("--model", required=True)
    d.add_argument("--trace-dir", type=Path, required=True, help="the server's torch_profiler_dir")
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--captures", default="decode-c1,decode-c64,prefill")
    d.add_argument("--prompt-len", type=int, default=1024)
    d.add_argument("--decode-tokens", type=int, default=512)
    d.add_argument("--chunk", type=int, default=8192, help="the server's max_num_batched_tokens")
    d.add_argument("--vocab", type=int, default=154880)
    d.add_argument("--seed", type=int, default=7)

    c = sub.add_parser("classify", help="a torch profiler trace by class of work")
    c.add_argument("traces", type=Path, nargs="+")
    c.add_argument("--markdown", type=Path)
    c.add_argument("--json", type=Path)

    co = sub.add_parser("collect", help="one run's results.json, profile.md, row.md")
    co.add_argument("--slice-manifest", type=Path, required=True)
    co.add_argument("--machine", type=Path, required=True)
    co.add_argument("--bench-dir", type=Path, action="append", default=[])
    co.add_argument("--llama-dir", type=Path, action="append", default=[],
                    help="a bench.yml run directory of llama-server at the same points")
    co.add_argument("--profile-dir", type=Path)
    co.add_argument("--variant", required=True)
    co.add_argument("--mtp", type=int, default=0)
    co.add_argument("--commit", default="unknown")
    co.add_argument("--date", required=True)
    co.add_argument("--out", type=Path, required=True)

    p = sub.add_parser("project", help="the 8x RTX PRO 6000 projection of a results.json")
    p.add_argument("results", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)

    pi = sub.add_parser("pins", help="requirement lines with hashes from a uv lock")
    pi.add_argument("lock", type=Path)
    pi.add_argument("names", nargs="+")
    pi.add_argument("--python", default="3.12")

    args = ap.parse_args(argv)
    if args.cmd == "drive":
        server = drive.Server(args.url, args.key_file.read_text().strip(), args.model)
        caps = drive.parse_captures(args.captures, prompt_len=args.prompt_len, chunk=args.chunk,
                                    decode_tokens=args.decode_tokens)
        for cap in caps:
            meta = drive.run_capture(server, cap, args.trace_dir, args.out, vocab=args.vocab, seed=args.seed)
            print(f"drive: {cap.label} captured in {meta['seconds']} s", flush=True)
        return 0
    if args.cmd == "classify":
        tables = {t.name.split(".")[0] if len(args.traces) == 1 else t.parent.name: classify.classify(t)
                  for t in args.traces}
        if args.json:
            _write(args.json, json.dumps(tables, indent=1) + "\n")
        _write(args.markdown, classify.markdown(tables))
        return 0
    if args.cmd == "collect":
        results = collect.collect(slice_manifest=args.slice_manifest, machine=args.machine,
                                  bench_dirs=args.bench_dir, profile_dir=args.profile_dir, variant=args.variant,
                                  mtp=args.mtp, commit=args.commit, date=args.date,
                                  llama_dirs=args.llama_dir)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        if results["profile"]:
            (args.out / "profile.md").write_text(classify.markdown(results["profile"]))
            (args.out / "projection.md").write_text(project.markdown(results["projection"]))
        (args.out / "row.md").write_text(collect.ROW_HEAD + "\n" + collect.row(results) + "\n")
        print((args.out / "row.md").read_text())
        return 0
    if args.cmd == "project":
        proj = project.project(json.loads(args.results.read_text()))
        if args.json:
            _write(args.json, json.dumps(proj, indent=1) + "\n")
        _write(args.markdown, project.markdown(proj))
        return 0
    if args.cmd == "pins":
        _write(None, "".join(line + "\n" for line in payload.pins(args.lock, args.names, args.python)))
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
