# Thin dispatcher: the logic lives in scripts/ and the hami-accounting CLI.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup up test verify proto lint bench soak clean

# Creates the virtual environment and installs the project with its dev tools.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Runs the three daemons on localhost with embedded defaults until Ctrl-C.
up: $(STAMP)
	$(VENV)/bin/hami-accounting up

# Runs every test (pytest's exit code 5, "no tests collected", is a failure).
test: $(STAMP)
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)

# Regenerates gen/ into a temporary folder and fails on any difference, then lints.
verify: $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(MAKE) lint

proto: $(STAMP)
	$(PY) scripts/gen_protos.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_pure_accounting.py

bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) -m bench $(BENCH_ARGS)

soak: $(STAMP)
	HAMI_ACCOUNTING_SOAK=1 $(PY) scripts/run_tests.py -m slow

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
