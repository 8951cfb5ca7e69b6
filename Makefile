# The two commands of the README: `make demo` and `make test`. Both set everything up first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_DIR ?= .fencepost-demo
PYTEST_ARGS ?=

.PHONY: demo test install clean browser hosttools lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(INSTALLED): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,pipeline,dev]'
	touch $(INSTALLED)

install: $(INSTALLED)

# Two workers (pytest-xdist): most tests wait on real processes, so two at once finish in about
# half the time on two cores; every test on Spark shares one worker and its session.
TEST_WORKERS ?= 2

# ruff (pinned in setup.cfg, configured in pyproject.toml) checks the format and the lint rules
# before the suite runs: `$(BIN)/ruff format .` fixes the first, `$(BIN)/ruff check --fix .` most of the second.
lint: $(INSTALLED)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: $(INSTALLED) browser hosttools lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The dashboard's browser test drives Debian's Chromium and its driver: installed here when run as
# root on a machine with apt-get; elsewhere that test skips and says why.
browser:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v chromedriver >/dev/null; then \
		echo "installing chromium and chromium-driver for the dashboard's browser test"; \
		apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1) \
		|| echo "could not install chromium: the dashboard's browser test will skip"; \
	fi

# The partition tests put members on test hosts (network namespaces, a bridge, iptables): iproute2 and
# iptables are installed here when run as root on a machine with apt-get; elsewhere those tests skip.
hosttools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! (command -v ip && command -v iptables) >/dev/null; then \
		echo "installing iproute2 and iptables for the test hosts"; \
		apt-get install -y -q iproute2 iptables >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q iproute2 iptables >/dev/null 2>&1) \
		|| echo "could not install iptables: the tests on test hosts will skip"; \
	fi

demo: $(INSTALLED)
	$(BIN)/python -m bench.demo --dev-dir $(DEMO_DIR)

clean:
	-$(BIN)/fencepost dev down --dev-dir $(DEMO_DIR)
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
