"""The serving slice measured on one GPU: one TP-8 rank of GLM-5 served as the unit serves it.

docs/validation/serving-slice.md says how it runs (tools/gpu/). Modules:

- ``payload``: the lock's pins (with hashes) of what the GPU machine must be carried.
- ``standin``: a stand-in for ``systemctl`` / ``systemd-run`` (test double: the GPU
  machine's PID 1 is not systemd), so that playbooks/bench.yml runs there unchanged.
- ``drive``: the profiler captures (vLLM's /start_profile, /stop_profile) under load.
- ``classify``: a torch profiler trace to milliseconds per step by class of work.
- ``project``: the measured per-rank step to 8x RTX PRO 6000 (a projection).
- ``collect``: one run's figures (bench summary, profile tables, machine) as results.json.
"""
