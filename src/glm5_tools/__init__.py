"""Python helpers of the GLM-5 vLLM deployment: fixtures, probes, diagnostics.

Each subpackage is typed and unit-tested under devtests/. Modules that need the
ML stack (torch, vllm, gguf) run from the ml-env / .venv-ml interpreter; the
rest run from the tool venv.
"""
