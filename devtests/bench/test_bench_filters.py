"""Role bench's filters: the URL host of a listen address, and the progress read from
the generator's progress bar."""

from __future__ import annotations

from load_file import load_file

filters = load_file("roles/bench/filter_plugins/bench_filters.py")


def test_loopback():
    assert filters.glm5_bench_loopback("0.0.0.0") == "127.0.0.1"
    assert filters.glm5_bench_loopback("::") == "[::1]"
    assert filters.glm5_bench_loopback("fd00::5") == "[fd00::5]"
    assert filters.glm5_bench_loopback("10.0.0.5") == "10.0.0.5"


def test_progress_reads_the_main_bar_not_the_warmup():
    log = ("Warming up with 1 requests...\n100%|##| 1/1 [00:00<00:00, 3.1it/s]\nStarting main benchmark run...\n"
           "  0%|   | 0/16 [00:00<?, ?it/s]\r 38%|###  | 6/16 [00:01<00:02, 4.2it/s]\r 50%|#### | 8/16 [00:02<00:02]")
    assert filters.glm5_bench_progress(log, 16) == {"done": 8, "total": 16}
    assert filters.glm5_bench_progress("Warming up\n100%| 1/1 [00:00", 16) == {"done": 0, "total": 0}
    assert filters.glm5_bench_progress("", 4) == {"done": 0, "total": 0}
