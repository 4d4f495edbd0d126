# Targets CI calls too. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# The benches, one a line: its module and arguments, for `make bench` (full size) and for
# `make bench-smoke` (small data, each well under a minute: run by `make test`).
BENCH = \
	'bench.playback --repeat 3' \
	'bench.lifecycle' \
	'bench.recovery'
BENCH_SMOKE = \
	'bench.playback --events 3000 --faust-events 1000 --timeout 60' \
	'bench.lifecycle --applications 20 --knee-rates 20 --knee-seconds 1 --bulk 100 --cpu-rate 20 --cpu-seconds 1' \
	'bench.recovery --records 20000 --lifecycle 0'
#: Seconds one smoke bench may take before it counts as failed (it is stopped).
BENCH_SMOKE_TIMEOUT ?= 240

.PHONY: help install venv run lint typecheck contracts docs test unit integration fuzz bench bench-smoke clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install:  ## everything the stack and the tests need (apt packages, dev venv, Kafka jars, npm packages)
	bash scripts/install-deps.sh

venv:  ## only the runtime Python environment (what `make run` needs; no test or lint tools)
	EXTRAS=none SKIP_APT=1 SKIP_KAFKA=1 SKIP_NPM=1 bash scripts/install-deps.sh

run: venv  ## the whole local stack: embedded broker + chDB + every agent group + console
	$(VENV)/bin/avcc dev

lint:  ## ruff lint + format check, and the import contracts (the floors of .importlinter)
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/ruff format --no-cache --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck:  ## mypy (strict on the packages)
	$(VENV)/bin/mypy

contracts:  ## contract artefacts fresh and backward compatible with the merge base (origin/main, main, else HEAD)
	$(PY) -m app.contract_docs --check
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		base=$$(git merge-base HEAD origin/main 2>/dev/null || git merge-base HEAD main 2>/dev/null || git rev-parse HEAD); \
		$(PY) -m app contracts check --against "$$base"; \
	else echo "not a git checkout: no ref to check contract compatibility against"; fi

docs:  ## the documentation site into site/ (mkdocs --strict: a broken link or a page missing from the nav fails)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Random order (pytest-randomly): modules, and the tests inside each, in a new order every run;
# the seed is printed first and last. Replay an order with PYTEST_ARGS=--randomly-seed=N.
unit:  ## unit tests only, in random order
	$(PY) -m pytest tests/unit -q -p randomly $(PYTEST_ARGS)

integration:  ## integration tests only (real Apache Kafka, ClickHouse, ganache), in random order
	$(PY) -m pytest tests/integration -q -p randomly --durations=40 $(PYTEST_ARGS)

# The bench smoke runs between the unit and the integration tests: a broken bench fails the
# build in about two minutes, before the long integration run.
test: install lint typecheck contracts docs  ## the full suite: lint, types, contracts, docs, unit tests, bench smoke, then integration on real servers
	$(PY) -m pytest tests/unit -q -p randomly $(PYTEST_ARGS)
	$(MAKE) --no-print-directory bench-smoke
	$(PY) -m pytest tests/integration -q -p randomly --durations=40 $(PYTEST_ARGS)

fuzz:  ## exploratory API fuzzing (not in `make test`): a new seed each run, 10x the cases
	AVCC_FUZZ_EXPLORE=1 AVCC_FUZZ_EXAMPLES_SCALE=$${AVCC_FUZZ_EXAMPLES_SCALE:-10} \
		$(PY) -m pytest tests/integration/test_api_fuzz.py -q -p no:randomly --timeout 7200 $(PYTEST_ARGS)

bench: install  ## benchmarks (printed, never asserted), each run appended to bench/RESULTS.md
	$(PY) -m bench.results --record bench/RESULTS.md $(BENCH)

bench-smoke: install  ## every bench on small data: fails when one does not produce all its figures
	$(PY) -m bench.results --timeout $(BENCH_SMOKE_TIMEOUT) $(BENCH_SMOKE)

clean:  ## remove local state
	rm -rf var site .pytest_cache .mypy_cache .ruff_cache
