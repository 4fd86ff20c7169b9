"""Helpers shared between test modules: builders, a test PKI, a served exporter."""
