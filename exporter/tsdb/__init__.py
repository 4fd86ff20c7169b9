"""Diagnosis from a time-series database: the frames rebuilt from Prometheus' HTTP API.

`llm-gpu-exporter diagnose --prometheus URL` asks Prometheus (or VictoriaMetrics, which
serves the same query API) for the `llmgpu_*` series of one node or of every node, turns
each scrape step into the `Frame` the live diagnosis builds from a snapshot, and runs the
same `Diagnoser` over them in time order: any node, any past moment, without the
exporter's own memory of the last fifteen minutes.
"""
