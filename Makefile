# One entry point for people and CI. `make run` demos, `make test` proves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 9445
SCENARIO ?= healthy
SPEED ?= 10

.PHONY: run test unit docs venv test-deps system-deps vllm-env lint typecheck bench clean

# Serving needs only the package's own dependencies; the tests add their extras.
$(BIN)/llm-gpu-exporter: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(BIN)/llm-gpu-exporter
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/llm-gpu-exporter

test-deps: $(VENV)/.test-deps

run: venv
	$(BIN)/llm-gpu-exporter serve --simulate $(SCENARIO) --speed $(SPEED) --listen 127.0.0.1:$(PORT)

system-deps:
	bash tests/setup/system_deps.sh

vllm-env: test-deps
	bash tests/e2e/vllm_env.sh

# Everything: lint and formatting, types, then every test (the generated docs and
# dashboards are checked by tests too).
test: test-deps system-deps vllm-env lint typecheck
	$(BIN)/pytest -q
	PY=$(PY) bash tests/setup/binding_venvs.sh

# The fast loop: unit tests that neither play scenarios, start servers nor wait on
# timeouts (those are marked slow); no Debian packages, no vLLM venv, no formatting checks.
unit: test-deps
	$(BIN)/pytest -q -m "not slow and not system and not integration and not e2e" tests/unit alerts/tests

# Regenerate every generated part: the metric catalog, the diagnosis, scenario, settings
# and layer tables, the dashboards' JSON and their panel reference, and the README's
# pictures of the page (with Debian's chromium; left as they are without it).
docs: test-deps
	$(BIN)/python -m exporter.docgen
	$(BIN)/python -m dashboards.generate
	$(BIN)/python -m exporter.docgen.screenshots

lint: test-deps
	$(BIN)/ruff check exporter tests bench dashboards alerts
	$(BIN)/ruff format --check exporter tests bench dashboards alerts

typecheck: test-deps
	$(BIN)/mypy

bench: test-deps
	$(BIN)/python bench/run.py --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .venv-vllm .cache
