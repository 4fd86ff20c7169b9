"""Grafana dashboards as code: grafanalib sources (*.dashboard.py) and their generated JSON."""
