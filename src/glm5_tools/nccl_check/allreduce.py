"""The torch part of the check: spawn one process per GPU and all-reduce.

Run from the ml-env interpreter::

    python -m glm5_tools.nccl_check --world-size 8 --size-mb 256 --min-busbw-gbps 10

The last line printed is the result as JSON; the exit status is 0 when the sum
was exact and the bus bandwidth reached the floor, 1 otherwise, 2 on a hang.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from glm5_tools.nccl_check.core import (
    Result,
    bus_bandwidth_gbps,
    expected_sum,
    nccl_env,
    verdict,
)

ELEMENT_BYTES = 4  # float32: every pattern value and sum is an exact integer


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _fill(torch: Any, numel: int, rank: int, device: Any) -> Any:
    index = torch.arange(numel, dtype=torch.int64, device=device)
    return (((index % 251) + 1) * (rank + 1)).to(torch.float32)


def _mismatches(torch: Any, tensor: Any, world_size: int) -> int:
    index = torch.arange(tensor.numel(), dtype=torch.int64, device=tensor.device)
    want = (((index % 251) + 1) * (world_size * (world_size + 1) // 2)).to(torch.float32)
    return int((tensor != want).sum().item())


def _worker(
    rank: int,
    world_size: int,
    backend: str,
    port: int,
    numel: int,
    iterations: int,
    timeout_s: float,
    queue: Any,
) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    try:
        # Exactness first, on a fresh buffer.
        data = _fill(torch, numel, rank, device)
        dist.all_reduce(data)
        bad = _mismatches(torch, data, world_size)
        # Bandwidth: warm up, then time the iterations.
        work = torch.ones(numel, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(work)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(work)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        # Exactness again, after the links were loaded.
        data = _fill(torch, numel, rank, device)
        dist.all_reduce(data)
        bad += _mismatches(torch, data, world_size)
        stats = torch.tensor([float(bad), elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            queue.put((int(stats[0].item()), float(stats[1].item())))
    finally:
        dist.destroy_process_group()


def run_check(
    world_size: int,
    backend: str = "nccl",
    size_mb: float = 256.0,
    iterations: int = 20,
    min_busbw_gbps: float = 0.0,
    p2p_disable: bool = False,
    p2p_level: str = "",
    timeout_s: float = 300.0,
) -> Result:
    """Spawn ``world_size`` ranks, all-reduce, verify, and return the verdict."""
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    if iterations < 1:
        raise ValueError("iterations must be at least 1")
    env = nccl_env(p2p_disable, p2p_level)
    os.environ.update(env)
    numel = max(251, int(size_mb * 1024 * 1024) // ELEMENT_BYTES)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(
        _worker,
        args=(world_size, backend, _free_port(), numel, iterations, timeout_s, queue),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    while not procs.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in procs.processes:
                proc.kill()
            raise TimeoutError(
                f"all-reduce over {world_size} ranks did not finish in {timeout_s:.0f} s "
                "(a hang is the usual sign of broken GPU peer-to-peer)"
            )
    mismatches, elapsed = queue.get()
    per_iter = elapsed / iterations
    algbw, busbw = bus_bandwidth_gbps(numel * ELEMENT_BYTES, per_iter, world_size)
    result = Result(
        world_size=world_size,
        backend=backend,
        nbytes=numel * ELEMENT_BYTES,
        iterations=iterations,
        seconds_per_iter=per_iter,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        sum_exact=mismatches == 0,
        mismatches=mismatches,
        min_busbw_gbps=min_busbw_gbps,
        env=env,
    )
    return verdict(result)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="glm5_tools.nccl_check", description=__doc__)
    parser.add_argument("--world-size", type=int, default=0, help="ranks (0 = every GPU)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--size-mb", type=float, default=256.0)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--min-busbw-gbps", type=float, default=0.0)
    parser.add_argument("--p2p-disable", action="store_true", help="set NCCL_P2P_DISABLE=1")
    parser.add_argument("--p2p-level", default="", help="set NCCL_P2P_LEVEL (LOC..SYS)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    world_size = args.world_size
    if world_size == 0:
        import torch

        world_size = torch.cuda.device_count() if args.backend == "nccl" else 1
        if world_size == 0:
            print("no CUDA device visible", file=sys.stderr)
            return 1
    try:
        result = run_check(
            world_size,
            backend=args.backend,
            size_mb=args.size_mb,
            iterations=args.iterations,
            min_busbw_gbps=args.min_busbw_gbps,
            p2p_disable=args.p2p_disable,
            p2p_level=args.p2p_level,
            timeout_s=args.timeout_s,
        )
    except TimeoutError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(result.message, file=sys.stderr if not result.ok else sys.stdout)
    print(result.to_json())
    return 0 if result.ok else 1


# expected_sum is re-exported for callers that verify values themselves.
__all__ = ["expected_sum", "main", "parse_args", "run_check"]
