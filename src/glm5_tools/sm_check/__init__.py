"""Ahead-of-time readiness check of Triton kernels for a GPU generation, on the CPU.

An engineer bringing a service up on a new GPU generation needs to know, before
the card is in the rack, whether every Triton kernel the service launches fits
the new chip: shared memory per block, registers per thread (and spills), and no
instruction the chip does not have. Triton compiles ahead of time for any target
with the ptxas its wheel ships, so all of this is answerable on a CPU machine.

Three steps, each usable alone:

* :mod:`.trace` runs launch-site code on CPU tensors with a *virtual device*
  (the target's compute capability and SM count, as torch and vLLM report them)
  and records every ``JITFunction`` launch -- the kernel, the bound arguments
  (dtypes, alignment, integer values), the constexprs, ``num_warps`` and
  ``num_stages`` -- without running it. Autotuned kernels record every config.
* :mod:`.compile` compiles each recorded launch for a target with Triton's own
  argument specialization and reads shared memory (kernel metadata), registers
  and spills (``ptxas -v``) and the SASS (``cuobjdump -sass``).
* :mod:`.report` judges each result against :mod:`.targets` and writes the table.

:mod:`.libs` does the same for compiled libraries (which SASS a ``.so`` holds for
an architecture, and which kernels back a set of torch ops). :mod:`.glm5` is the
GLM-5 scenario set (the serving path of this project); ``python -m
glm5_tools.sm_check --help`` runs it.
"""
