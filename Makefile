# One entry point for people and CI. `make run` demos, `make test` proves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 9445
SCENARIO ?= healthy

.PHONY: run test venv system-deps vllm-env lint typecheck dashboards bench clean

$(BIN)/llm-gpu-exporter: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/llm-gpu-exporter

run: venv
	$(BIN)/llm-gpu-exporter serve --simulate $(SCENARIO) --listen 127.0.0.1:$(PORT)

system-deps:
	bash tests/setup/system_deps.sh

vllm-env: venv
	bash tests/e2e/vllm_env.sh

test: venv system-deps vllm-env
	$(BIN)/ruff check exporter tests bench dashboards alerts
	$(BIN)/mypy
	$(BIN)/pytest -q
	PY=$(PY) bash tests/setup/binding_venvs.sh

lint: venv
	$(BIN)/ruff check exporter tests bench dashboards alerts
	$(BIN)/ruff format --check exporter tests bench dashboards alerts

typecheck: venv
	$(BIN)/mypy

dashboards: venv
	$(BIN)/python -m dashboards.generate

bench: venv
	$(BIN)/python bench/run.py --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .venv-vllm .cache
