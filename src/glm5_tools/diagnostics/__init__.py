"""The garbage-output funnel, automated: six stages that localize a GLM-5 serving fault.

Stage 1 GGUF dequantization, 2 tensor-name mapping, 3 tensor-parallel sharding,
4 GGUF linear layers as vLLM assembles them, 5 Triton MLA attention, 6 end to end.
See docs/diagnostics.md.
"""

from glm5_tools.diagnostics.result import StageResult, Verdict

__all__ = ["StageResult", "Verdict"]
