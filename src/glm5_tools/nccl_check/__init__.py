"""All-reduce check across every GPU of a host, run before vLLM starts.

On PCIe servers IOMMU and PCIe ACS settings decide whether GPU peer-to-peer
traffic works. When it is broken NCCL can hang or return wrong sums, which
shows up as garbage model output. This check runs an all-reduce with torch
and NCCL from the ml-env, verifies the sum exactly and reports the bus
bandwidth, so a broken path is caught before the service starts.

The pure helpers live in :mod:`glm5_tools.nccl_check.core` (no torch import);
the torch part lives in :mod:`glm5_tools.nccl_check.allreduce`.
"""
