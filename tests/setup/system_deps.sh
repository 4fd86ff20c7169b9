#!/usr/bin/env bash
# Installs the Debian packages the integration tests run for real, when missing.
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
# victoria-metrics brings the victoria-metrics, vmagent, vmalert and vmauth binaries
{ command -v victoria-metrics && command -v vmalert && command -v vmauth; } >/dev/null || need+=(victoria-metrics)
if ((${#need[@]})); then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
