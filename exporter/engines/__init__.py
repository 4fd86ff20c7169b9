"""Inference-engine metrics: targets, scraping, normalization to llmgpu_engine_*, GPU joins."""
