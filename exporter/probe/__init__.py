"""Allocator probe: a vLLM plugin that reports PyTorch caching-allocator state to files.

NVML sees how much memory a process holds, not how the caching allocator inside it has
carved that memory up. The probe runs inside the serving process (as a
``vllm.general_plugins`` entry point), samples the allocator, and writes one small JSON
file per process into a probe directory; the exporter reads that directory.

Modules: ``plugin`` (the code that runs inside vLLM), ``fragmentation`` (pure maths over
``torch.cuda.memory_snapshot()``), ``schema`` (the file format), ``reader`` (the
exporter side). Nothing here imports torch or any other heavy package at import time.
"""
