"""A co-located dcgm-exporter as a source of profiling counters for GPUs without GPM."""
