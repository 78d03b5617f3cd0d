"""Compile recorded launches for a target and read what the chip will need.

Specialization is Triton's own: the recorded arguments are rebuilt (tensors of
the recorded dtype and 16-byte alignment, integers with their values) and bound
by the binder Triton's launcher uses, so the signature, constexprs and
divisibility attributes are those of the real launch. Shared memory per block
comes from the compiled kernel's metadata (what the launcher compares with the
device's opt-in limit), registers and spills from ``ptxas -v`` (Triton's
make_cubin runs ptxas with -v), the SASS from ``cuobjdump -sass`` of the cubin.
Results are cached as JSON under a directory keyed by Triton's version, the
kernel's source hash (Triton's cache_key: its source and the jit functions it
calls), the specialization, the options and the target.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .targets import Target
from .trace import LaunchRecord, materialize, resolve

_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)")


@dataclass
class KernelResult:
    kernel: str
    scenario: str
    target: str
    launch: str  # constexprs, num_warps, num_stages as launched
    num_warps: int = 0
    num_stages: int = 0
    shared: int = -1
    regs: int = -1
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    forbidden: list[str] = field(default_factory=list)
    mma: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    cached: bool = False

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tool(name: str) -> Path:
    """A CUDA binary tool shipped in Triton's wheel (ptxas, cuobjdump, nvdisasm)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not in Triton's wheel ({path})")
    return path


def describe(rec: LaunchRecord) -> str:
    parts = [f"{k}={v}" for k, v in sorted(rec.constexpr_kwargs().items()) if not isinstance(v, float)]
    opts = rec.launch_options()
    parts += [f"{k}={opts[k]}" for k in ("num_warps", "num_stages") if k in opts]
    return " ".join(parts)


def sass_summary(cubin: bytes, forbidden: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(forbidden instructions found, MMA-like opcodes used) in a cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(
            [str(tool("cuobjdump")), "-sass", f.name], check=True, capture_output=True, text=True
        ).stdout
    return scan_sass(sass, forbidden)


def scan_sass(sass: str, forbidden: tuple[str, ...]) -> tuple[list[str], list[str]]:
    ops: Counter[str] = Counter()
    found: set[str] = set()
    for m in _OPCODE.finditer(sass):
        opcode, mods = m.group(1), m.group(2)
        ops[opcode] += 1
        full = opcode + mods
        for bad in forbidden:
            if full.startswith(bad) or f".{bad}" in mods:
                found.add(full)
    mma = sorted(op for op in ops if "MMA" in op)
    return sorted(found), mma


def _bind(rec: LaunchRecord, target: Target) -> tuple[Any, Any, Any, dict[Any, Any], dict[Any, Any], Any]:
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = rec.fn if rec.fn is not None else resolve(rec.kernel)
    gpu = GPUTarget("cuda", target.capability, 32)
    backend = make_backend(gpu)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args = [materialize(a) for a in rec.args]
    kwargs = {k: materialize(v) for k, v in rec.kwargs.items()}
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return fn, gpu, options, signature, constexprs, attrs


def cache_key(rec: LaunchRecord, target: Target) -> str:
    import triton

    fn, _, options, signature, constexprs, attrs = _bind(rec, target)
    blob = json.dumps(
        [
            triton.__version__,
            fn.cache_key,
            rec.kernel,
            signature,
            sorted((str(k), repr(v)) for k, v in constexprs.items()),
            sorted((str(k), repr(v)) for k, v in attrs.items()),
            sorted((k, repr(v)) for k, v in options.__dict__.items()),
            asdict(target),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def compile_launch(rec: LaunchRecord, target: Target, cache_dir: Path | None = None) -> KernelResult:
    """Compile one recorded launch for target and measure it (never raises for a kernel's own failure)."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    opts = rec.launch_options()
    result = KernelResult(
        rec.kernel,
        rec.scenario,
        target.name,
        describe(rec),
        int(opts.get("num_warps", 4)),
        int(opts.get("num_stages", 3)),
    )
    start = time.monotonic()
    try:
        fn, gpu, options, signature, constexprs, attrs = _bind(rec, target)
        key = cache_key(rec, target)
        cached = cache_dir / f"{key}.json" if cache_dir is not None else None
        if cached is not None and cached.exists():
            data = json.loads(cached.read_text(encoding="utf-8"))
            data.update(kernel=rec.kernel, scenario=rec.scenario, launch=result.launch, cached=True)
            return KernelResult(**data)
        log = io.StringIO()
        with (
            knobs.nvidia.scope(),
            knobs.compilation.scope(),
            contextlib.redirect_stdout(log),
        ):
            knobs.nvidia.dump_ptxas_log = True
            knobs.compilation.always_compile = True
            kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=gpu, options=options.__dict__)
        text = log.getvalue()
        regs = _REGS.search(text)
        spill = _SPILL.search(text)
        result.shared = int(kernel.metadata.shared)
        result.num_warps = int(kernel.metadata.num_warps)
        result.num_stages = int(kernel.metadata.num_stages)
        result.regs = int(regs.group(1)) if regs else -1
        if spill:
            result.stack, result.spill_stores, result.spill_loads = (int(g) for g in spill.groups())
        result.forbidden, result.mma = sass_summary(kernel.asm["cubin"], target.forbidden_sass)
        result.seconds = round(time.monotonic() - start, 2)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(result.to_json()), encoding="utf-8")
    except Exception as exc:  # a kernel that does not compile is a finding, not a crash
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        result.seconds = round(time.monotonic() - start, 2)
    return result


def dedupe(records: list[LaunchRecord], target: Target) -> list[LaunchRecord]:
    """One record per compiled artifact on target (Triton's specialization: sizes
    and strides that do not specialize collapse); scenarios joined. A record that
    does not bind stays as it is (compile_launch reports its error)."""
    out: dict[str, LaunchRecord] = {}
    for rec in records:
        try:
            key = cache_key(rec, target)
        except Exception:
            key = rec.key()
        if key in out:
            have = out[key].scenario.split(", ")
            out[key].scenario = ", ".join([*have, *(s for s in rec.scenario.split(", ") if s not in have)])
        else:
            out[key] = LaunchRecord(rec.kernel, rec.scenario, rec.args, dict(rec.kwargs), rec.fn)
    return list(out.values())


def compile_all(
    records: list[LaunchRecord], targets: list[Target], cache_dir: Path | None = None, jobs: int = 1
) -> list[KernelResult]:
    """Every record for every target; jobs > 1 compiles in forked workers."""
    work = [(i, t) for t in targets for i in range(len(records))]
    if jobs <= 1:
        return [compile_launch(records[i], t, cache_dir) for i, t in work]
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    global _WORK
    _WORK = (records, cache_dir)
    with ctx.Pool(jobs) as pool:
        return pool.starmap(_compile_index, work)


_WORK: tuple[list[LaunchRecord], Path | None] = ([], None)


def _compile_index(i: int, target: Target) -> KernelResult:
    records, cache_dir = _WORK
    return compile_launch(records[i], target, cache_dir)
