"""TEST DOUBLE of `vllm bench serve` for devtests/bench/test_bench_progress.py: writes what
the real generator writes to its log (a warm-up bar, the main tqdm bar updated in place
with carriage returns, then the result table its block-buffered stdout flushes at its
exit), a step every STEP_S seconds, and exits with the status it is given.
Usage: generator_double.py TOTAL EXIT_STATUS [HOLD_FILE]: with HOLD_FILE, it stops
half-way until that file exists (the test creates it once it has seen a progress line,
so that a line is always printed while the generator runs), at most HOLD_S seconds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

STEP_S = 0.2
HOLD_S = 120


def main() -> int:
    total, status = int(sys.argv[1]), int(sys.argv[2])
    hold = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    out = sys.stdout
    out.write("Starting initial single prompt test run...\n")
    out.write("Warmup:  100%|##########| 1/1 [00:00<00:00,  9.10it/s]\n")
    for done in range(total + 1):
        out.write(f"\r{100 * done // total:3d}%|          | {done}/{total} [00:0{done}<00:01,  2.00it/s]")
        out.flush()
        time.sleep(STEP_S)
        if hold is not None and done == total // 2:
            until = time.monotonic() + HOLD_S
            while not hold.exists() and time.monotonic() < until:
                time.sleep(0.1)
    out.write("\n============ Serving Benchmark Result ============\n")
    out.writelines(f"Figure {i}:{' ' * 30}{i}.00\n" for i in range(90))
    out.write("==================================================\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
