"""The serving benchmark's analysis (playbooks/bench.yml, role bench, docs/bench.md):
the plan of points and their `vllm bench serve` command lines, the figures from the
generator's JSON, the server's /metrics before/after, the Markdown report, the plots
and the verdict against thresholds and the previous run."""
