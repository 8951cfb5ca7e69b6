# The two commands of the README: `make demo` and `make test`. Both set everything up first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_DIR ?= .fencepost-demo
PYTEST_ARGS ?=

.PHONY: demo test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(INSTALLED): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)

install: $(INSTALLED)

test: $(INSTALLED)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: $(INSTALLED)
	$(BIN)/python -m bench.demo --dev-dir $(DEMO_DIR)

clean:
	-$(BIN)/fencepost dev down --dev-dir $(DEMO_DIR)
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
