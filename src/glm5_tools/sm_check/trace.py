"""Record Triton kernel launches made by launch-site code on the CPU.

``recording()`` replaces ``JITFunction.run`` (and ``Autotuner.run``) so that a
launch records the kernel and its bound arguments instead of running: the code
around the launch (how it picks block sizes, stages, splits) runs for real, the
kernel does not. Outputs of recorded kernels stay as allocated (garbage), so
only code whose later launch decisions do not read kernel results can be traced
this way -- true of launch sites that size work from shapes and metadata.

``virtual_device(target)`` makes torch (and vLLM, when it is imported) report
the target's compute capability and SM count, and makes CPU tensors say
``is_cuda``, so capability- and SM-count-dependent branches take the target's
side. ``recording_ops()`` turns calls through ``torch.ops.<namespace>.<op>`` into
records (compiled-library ops cannot run on CPU tensors) so the traced code gets
past them and the ops it reaches are listed.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from .targets import Target


@dataclass(frozen=True)
class ArgSpec:
    """What Triton's specialization sees of one argument."""

    kind: str  # tensor | int | float | bool | none | str | tl_dtype
    value: Any = None  # tensors: dtype name; else the value
    aligned: bool = True  # tensors: data_ptr % 16 == 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "aligned": self.aligned}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArgSpec:
        return cls(str(data["kind"]), data.get("value"), bool(data.get("aligned", True)))


@dataclass
class LaunchRecord:
    kernel: str  # module:qualname
    scenario: str
    args: list[ArgSpec]
    kwargs: dict[str, ArgSpec]
    fn: Any = field(default=None, repr=False, compare=False)  # the JITFunction, in-process

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def constexpr_kwargs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.kwargs.items() if k not in ("num_warps", "num_stages", "num_ctas")}

    def launch_options(self) -> dict[str, Any]:
        return {k: self.kwargs[k].value for k in ("num_warps", "num_stages", "num_ctas") if k in self.kwargs}

    def key(self) -> str:
        """Identity of the compiled artifact (scenario excluded)."""
        import json

        return json.dumps(
            [self.kernel, [a.to_json() for a in self.args], {k: v.to_json() for k, v in sorted(self.kwargs.items())}],
            sort_keys=True,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "scenario": self.scenario,
            "args": [a.to_json() for a in self.args],
            "kwargs": {k: v.to_json() for k, v in self.kwargs.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchRecord:
        return cls(
            str(data["kernel"]),
            str(data["scenario"]),
            [ArgSpec.from_json(a) for a in data["args"]],
            {str(k): ArgSpec.from_json(v) for k, v in data["kwargs"].items()},
        )


def spec_of(value: Any) -> ArgSpec:
    import torch
    import triton.language as tl

    if isinstance(value, torch.Tensor):
        return ArgSpec("tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ArgSpec("bool", value)
    if isinstance(value, int):
        return ArgSpec("int", value)
    if isinstance(value, float):
        return ArgSpec("float", value)
    if value is None:
        return ArgSpec("none")
    if isinstance(value, str):
        return ArgSpec("str", value)
    if isinstance(value, tl.dtype):
        return ArgSpec("tl_dtype", str(value))
    if isinstance(value, tl.constexpr):
        return spec_of(value.value)
    raise TypeError(f"cannot record a Triton argument of type {type(value).__name__}")


def materialize(spec: ArgSpec) -> Any:
    """A stand-in that Triton's binder specializes exactly as the recorded argument."""
    import torch
    import triton.language as tl

    if spec.kind == "tensor":
        base = torch.empty(64, dtype=getattr(torch, str(spec.value)))
        return base if spec.aligned else base[1:]
    if spec.kind == "tl_dtype":
        return tl.dtype(str(spec.value))
    return spec.value


def kernel_name(fn: Any) -> str:
    return f"{fn.module}:{fn.fn.__qualname__}"


def resolve(kernel: str) -> Any:
    """The JITFunction named module:qualname (unwrapping autotune/heuristics)."""
    from triton.runtime.jit import JITFunction

    module, qualname = kernel.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):
        obj = obj.fn
    return obj


class Recorder:
    def __init__(self) -> None:
        self.launches: list[LaunchRecord] = []
        self.ops: dict[str, set[str]] = {}
        self.scenario = ""
        self._lock = threading.Lock()

    def add_launch(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        kw = {k: spec_of(v) for k, v in kwargs.items() if k not in ("grid", "warmup")}
        rec = LaunchRecord(kernel_name(fn), self.scenario, [spec_of(a) for a in args], kw, fn)
        with self._lock:
            self.launches.append(rec)

    def add_op(self, name: str) -> None:
        with self._lock:
            self.ops.setdefault(name, set()).add(self.scenario)

    @contextlib.contextmanager
    def in_scenario(self, name: str) -> Iterator[None]:
        before, self.scenario = self.scenario, name
        try:
            yield
        finally:
            self.scenario = before

    def unique(self) -> list[LaunchRecord]:
        """One record per compiled artifact; scenarios joined."""
        seen: dict[str, LaunchRecord] = {}
        for rec in self.launches:
            k = rec.key()
            if k in seen:
                if rec.scenario not in seen[k].scenario.split(", "):
                    seen[k].scenario += ", " + rec.scenario
            else:
                seen[k] = LaunchRecord(rec.kernel, rec.scenario, rec.args, dict(rec.kwargs), rec.fn)
        return list(seen.values())


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = obj.__dict__.get(name, missing) if hasattr(obj, "__dict__") else getattr(obj, name, missing)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Launches of every JITFunction record instead of running."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        recorder.add_launch(self, args, kwargs)

    def tune(self: Any, *args: Any, **kwargs: Any) -> None:
        # every config can be the one the device picks: record them all
        for config in self.configs:
            self.fn.run(*args, **{**kwargs, **config.all_kwargs()})

    with _patched(JITFunction, "run", run), _patched(Autotuner, "run", tune):
        yield recorder


class _OpNamespace:
    def __init__(self, namespace: str, recorder: Recorder) -> None:
        self._namespace = namespace
        self._recorder = recorder

    def __getattr__(self, op: str) -> Callable[..., None]:
        if op.startswith("__"):
            raise AttributeError(op)
        name = f"{self._namespace}.{op}"

        def call(*args: Any, **kwargs: Any) -> None:
            self._recorder.add_op(name)

        call.default = call  # type: ignore[attr-defined]
        return call


@contextlib.contextmanager
def recording_ops(recorder: Recorder, namespaces: tuple[str, ...] = ("_C", "_moe_C", "_C_cache_ops")) -> Iterator[None]:
    """Calls through torch.ops.<namespace>.<op> record the op and return None."""
    import torch

    with contextlib.ExitStack() as stack:
        for ns in namespaces:
            stack.enter_context(_patched(torch.ops, ns, _OpNamespace(ns, recorder)))
        yield


@contextlib.contextmanager
def virtual_device(target: Target, *, capturing: bool = False) -> Iterator[None]:
    """torch reports the target's device; CPU tensors say is_cuda."""
    import torch

    props = SimpleNamespace(
        name=target.card or target.name,
        major=target.major,
        minor=target.minor,
        multi_processor_count=target.sm_count,
        total_memory=96 * 1024**3,
        shared_memory_per_block_optin=target.smem_per_block,
        warp_size=32,
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch.cuda, "get_device_capability", lambda *a, **k: (target.major, target.minor)))
        stack.enter_context(_patched(torch.cuda, "get_device_properties", lambda *a, **k: props))
        stack.enter_context(_patched(torch.cuda, "is_current_stream_capturing", lambda: capturing))
        stack.enter_context(_patched(torch.cuda, "current_device", lambda: 0))
        stack.enter_context(_patched(torch.Tensor, "is_cuda", property(lambda self: True)))
        yield


def install_vllm_platform(target: Target) -> None:
    """vLLM's current_platform becomes a CUDA platform with the target's capability
    and SM count, for the rest of this process: vllm.platforms' own and every
    loaded module's ``current_platform`` binding. Import the vLLM modules to trace
    first (on a host without a GPU they import on vLLM's no-device platform; a
    CUDA platform at import would need vllm._C, i.e. libcuda)."""
    import sys

    import vllm.platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class VirtualCudaPlatform(Platform):  # type: ignore[misc]
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(target.major, target.minor)

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return target.sm_count

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return target.card or target.name

    old = getattr(vllm.platforms, "_current_platform", None) or vllm.platforms.current_platform
    new = VirtualCudaPlatform()
    vllm.platforms._current_platform = new
    for module in list(sys.modules.values()):
        if getattr(module, "current_platform", None) is old and module is not vllm.platforms:
            module.current_platform = new  # type: ignore[attr-defined]


def untraced(records: list[LaunchRecord], modules: list[str]) -> list[str]:
    """module:name of each Triton kernel defined in modules that no record
    launched and no launched kernel calls (by name): kernels the scenarios
    never reached."""
    from triton.runtime.jit import JITFunction

    launched = {r.kernel for r in records}
    sources = [resolve(k).src for k in launched]
    defined: list[tuple[str, str, str]] = []  # (attr, name, source) of each module's JIT functions
    for module_name in modules:
        module = importlib.import_module(module_name)
        for attr, value in sorted(vars(module).items()):
            fn = value
            while fn is not None and not isinstance(fn, JITFunction):
                fn = getattr(fn, "fn", None)
            if fn is None or fn.module != module_name:
                continue
            defined.append((attr, kernel_name(fn), fn.src))
    return unreached(launched, sources, defined)


def unreached(launched: set[str], sources: list[str], defined: list[tuple[str, str, str]]) -> list[str]:
    """Names of the JIT functions of defined ((attr, name, source) each) that are not
    launched and not called (by attribute name) from a launched kernel's source
    (sources) or, transitively, from a helper so reached."""
    reached = {name for _, name, _ in defined if name in launched}
    sources = list(sources)
    grew = True
    while grew:
        grew = False
        for attr, name, src in defined:
            if name not in reached and any(f"{attr}(" in s for s in sources):
                reached.add(name)
                sources.append(src)
                grew = True
    return [name for _, name, _ in defined if name not in reached]
