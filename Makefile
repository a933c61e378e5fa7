# The two commands of the README: `make demo` and `make test`. Each sets up what it needs first.
VENV := .venv
PYTHON := $(VENV)/bin/python
# Debian tools the lifecycle runs (tar and coreutils come with every Debian system).
DEBIAN_TOOLS := rsync

.PHONY: demo test setup setup-dev .debian-tools lint format clean

demo: setup  ## Run the demo grid on this machine, then say where the comparison is.
	scripts/run_local.sh

test: setup-dev  ## Run the whole test suite (slow end-to-end tests included).
	$(PYTHON) -m pytest

lint: setup-dev  ## The checks CI runs besides the tests.
	$(VENV)/bin/snakemake --lint
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup-dev
	$(VENV)/bin/snakefmt Snakefile rules
	$(VENV)/bin/ruff format .

setup: $(VENV)/.installed-runtime .debian-tools
setup-dev: $(VENV)/.installed-dev .debian-tools

.debian-tools:
	@for tool in $(DEBIAN_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip

$(VENV)/.installed-runtime: requirements.txt | $(VENV)/bin/python
	$(PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PYTHON) -m pip install --quiet -r requirements-dev.txt
	touch $@ $(VENV)/.installed-runtime

clean:  ## Remove everything the workflow wrote here (not the venv).
	rm -rf archives models checkpoints results logs .snakemake
