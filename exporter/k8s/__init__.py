"""Kubernetes integration: pod attribution (kubelet pod-resources, cgroups) and pod discovery."""
