#!/usr/bin/env bash
# The NVML collectors against the oldest nvidia-ml-py pyproject.toml allows and the newest:
# one venv each (.cache/binding-venvs/<version>), the project installed --no-deps plus its
# other dependencies, then the collector tests on the simulator. A constant or function
# newer than the floor fails here, not on a customer's node.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
FLOOR=${FLOOR:-12.535.77}    # lowest release matching "nvidia-ml-py>=12.535"
NEWEST=${NEWEST:-13.615.71}
TESTS=(tests/unit/test_nvml_collectors.py tests/unit/test_nvml_profiles.py tests/unit/test_nvml_conformance.py)

# Runtime dependencies from pyproject.toml, nvidia-ml-py left out (each venv pins its own).
mapfile -t DEPS < <("$PY" - <<'PYEOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith("nvidia-ml-py")))
PYEOF
)

for version in "$FLOOR" "$NEWEST"; do
  venv=.cache/binding-venvs/$version
  if [ ! -x "$venv/bin/pytest" ]; then
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "nvidia-ml-py==$version" "${DEPS[@]}" "pytest>=8" "pytest-timeout>=2.3"
  fi
  "$venv/bin/pip" install -q --no-deps -e .
  got=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("nvidia-ml-py"))')
  [ "$got" = "$version" ] || { echo "venv $venv has nvidia-ml-py $got, not $version" >&2; exit 1; }
  echo "== nvidia-ml-py $version"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
done
