# Targets CI calls too. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help install venv run lint typecheck contracts test unit integration bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install:  ## everything the stack and the tests need (apt packages, dev venv, Kafka jars, npm packages)
	bash scripts/install-deps.sh

venv:  ## only the runtime Python environment (what `make run` needs; no test or lint tools)
	EXTRAS=none SKIP_APT=1 SKIP_KAFKA=1 SKIP_NPM=1 bash scripts/install-deps.sh

run: venv  ## the whole local stack: embedded broker + chDB + every agent group + console
	$(VENV)/bin/avcc dev

lint:  ## ruff lint + format check
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/ruff format --no-cache --check .

typecheck:  ## mypy (strict on the packages)
	$(VENV)/bin/mypy

contracts:  ## contract artefacts fresh and backward compatible with the merge base (origin/main, main, else HEAD)
	$(PY) -m app.platform.contract_docs --check
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		base=$$(git merge-base HEAD origin/main 2>/dev/null || git merge-base HEAD main 2>/dev/null || git rev-parse HEAD); \
		$(PY) -m app contracts check --against "$$base"; \
	else echo "not a git checkout: no ref to check contract compatibility against"; fi

unit:  ## unit tests only
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

integration:  ## integration tests only (real Apache Kafka, ClickHouse, ganache)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test: install lint typecheck contracts  ## the full suite: lint, types, unit + integration on real servers
	$(PY) -m pytest tests -q $(PYTEST_ARGS)

bench:  ## benchmarks (printed, never asserted)
	$(PY) -m bench.playback --repeat 3
	$(PY) -m bench.lifecycle

clean:  ## remove local state
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
