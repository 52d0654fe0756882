# Thin dispatcher: the logic lives in scripts/ and the hami-accounting CLI.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The interpreter that creates .venv and runs the Debian set-up (standard library only).
SYSTEM_PYTHON ?= python3
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: setup system-setup up test verify proto lint bench soak tags clean

# Creates the virtual environment and installs the project with its dev tools. pip lists each
# package as it goes (about a minute on a fresh machine, seconds afterwards). setuptools' note on
# editable installs (folders that shadow the package) is silenced: here those folders are it.
$(STAMP): pyproject.toml
	@echo "== .venv: creating the virtual environment"
	test -x $(PY) || $(SYSTEM_PYTHON) -m venv $(VENV)
	@echo "== .venv: updating pip"
	$(PIP) install -q -U pip
	@echo "== .venv: installing hami-accounting and its dev tools from PyPI"
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install --progress-bar off -e '.[dev]'
	touch $(STAMP)
	@echo "== .venv: ready"

setup: $(STAMP)

# Runs the three daemons on localhost with embedded defaults until Ctrl-C.
up: $(STAMP)
	$(VENV)/bin/hami-accounting up

# The Debian packages of the Go module and its interop test: installed as root, otherwise
# named (then stop).
system-setup:
	@$(SYSTEM_PYTHON) scripts/system_setup.py

# Runs every test (pytest's exit code 5, "no tests collected", is a failure). The Debian
# packages are checked first, so a missing one stops the run before anything else happens.
test:
	@$(MAKE) --no-print-directory system-setup
	@$(MAKE) --no-print-directory $(STAMP)
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)

# Regenerates gen/ and clients/go/accountingv1 into a temporary folder and fails on any
# difference, checks that the webhook's matchConditions and the chart's vendor file follow the
# vendor table and the chart's values table its schema, then lints. The Go code is generated
# with Debian's protoc and plugins, so the Debian packages are checked (and installed, as root)
# first, as for make test.
verify:
	@$(MAKE) --no-print-directory system-setup
	@$(MAKE) --no-print-directory $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_webhook_match.py --check
	$(PY) scripts/gen_chart_docs.py --check
	$(MAKE) lint

proto: $(STAMP)
	$(PY) scripts/gen_protos.py

# gofmt and go vet need the Debian Go toolchain (make system-setup).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_pure_accounting.py
	$(PY) scripts/check_docs.py
	$(PY) scripts/go_module.py lint

bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) -m bench $(BENCH_ARGS)

soak: $(STAMP)
	HAMI_ACCOUNTING_SOAK=1 $(PY) scripts/run_tests.py -m slow

# The git tags of the releases in releases.toml (v0.2.0, ...); nothing reads them.
tags:
	$(SYSTEM_PYTHON) scripts/tag_releases.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
