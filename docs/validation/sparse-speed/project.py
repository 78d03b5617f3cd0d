"""A projection (not a measurement) of GLM-5's single-stream decode on 8x RTX PRO 6000 (issue 23, item 8).

usage: python project.py results.json
From bench.py's results (one layer's sparse attention step, batch 1, 8 heads = TP 8,
measured on the GPU validation machine) and stated assumptions, the per-token time:

  78 layers x (attention step scaled to the RTX PRO 6000's memory bandwidth
               + 2 all-reduces at the NCCL latency)
  + the weights each rank reads per token at that bandwidth (lower bound).

Nothing here ran on an RTX PRO 6000 (SM 12.0): the scaling assumes the attention
step is memory-bound or launch-bound alike on both cards, which is a projection.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS = 78
ALLREDUCE_US = 24.0  # published NCCL all-reduce latency on 8x RTX PRO 6000 (PCIe); no nccl_check number yet
PRO6000_GBPS = 1792.0  # RTX PRO 6000 Blackwell: 1.79 TB/s GDDR7 (datasheet)
# GLM-5: ~40 B active parameters per token; UD-Q4_K_XL averages ~4.8 bits each
ACTIVE_PARAMS = 40e9
BITS_PER_PARAM = 4.8
PUBLISHED = {"without speculative decoding": 50.0, "with MTP": 90.0}


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    measured_gbps = res["read_bandwidth_GBps_measured"]
    scale = measured_gbps / PRO6000_GBPS  # > 1: the RTX PRO 6000 reads slower
    weights_ms = ACTIVE_PARAMS * BITS_PER_PARAM / 8 / 8 / (PRO6000_GBPS * 1e6)
    rows = []
    for run in res["runs"]:
        if run["batch"] != 1 or run["heads"] != 8:
            continue
        ms = run["ms"]
        for way, key in (("new sparse (a)", "a_total"), ("main's sparse (b)", "b_total"), ("dense (c)", "c_total")):
            attn_ms = ms[key] * scale
            per_token = LAYERS * (attn_ms + 2 * ALLREDUCE_US / 1e3) + weights_ms
            rows.append(
                {
                    "ctx": run["ctx"],
                    "way": way,
                    "attention_ms_per_layer_measured": ms[key],
                    "attention_ms_per_token_projected": LAYERS * attn_ms,
                    "allreduce_ms_per_token": LAYERS * 2 * ALLREDUCE_US / 1e3,
                    "weights_ms_per_token_lower_bound": weights_ms,
                    "tokens_per_s_upper_bound": 1e3 / per_token,
                }
            )
    out = {
        "projection": True,
        "device_measured": res["device"],
        "bandwidth_scale_to_pro6000": scale,
        "published_tokens_per_s": PUBLISHED,
        "rows": rows,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
