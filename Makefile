# The two commands: `make run` serves the console, `make test` runs the suite.
# Both create .venv/ and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp

.PHONY: run test test-fast lint clean-venv

# Python keeps its bytecode and pytest its rewritten test modules (__pycache__/, git-ignored) even
# where the environment sets PYTHONDONTWRITEBYTECODE: else every run, and every lane of `make test`,
# compiles the ~600 test modules again (7 s of the fast lane's 71 s on this 2-core machine).
export PYTHONDONTWRITEBYTECODE :=

# What the tests do to the servers they are pointed at, said before they run.
SERVICES_WARNING = echo "make $@: the tests create and drop PostgreSQL databases named satrain_test_* on the server of" \
  "TEST_POSTGRES_URL=$${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres} and FLUSHDB Redis" \
  "TEST_REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15} (each test process its own: that database number or one of the seven below it); point both at servers" \
  "or a Redis database no deployment shares."

# What the console needs to run, and the examples' training libraries; then the container tools.
$(RUN_STAMP): pyproject.toml client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch first, pinned, so nothing pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[ckpt]'
	# The command-line client (its own package, no Django): `satrain` on the venv's PATH.
	$(PY) -m pip install --quiet -e ./client
	@# Jobs run in Podman containers, images come from a local registry and the default image is
	@# built from Debian packages: install the tools where we may (root with apt; waiting for
	@# another apt, e.g. .ci/run's, to finish), else say so.
	@missing=""; for t in podman runc skopeo mmdebstrap docker-registry catatonit; do \
	  command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq $$missing >/dev/null 2>&1 || \
	      { apt-get -o DPkg::Lock::Timeout=900 update -qq && \
	        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq $$missing >/dev/null; }; }; } || \
	  echo "WARNING:$$missing not installed: jobs will not run until they are (as root: apt-get install$$missing) or JOB_SANDBOX=off is set."; \
	fi
	@touch $(RUN_STAMP)

# ... and the test and benchmark tools (pytest, Playwright, DeepSpeed, schemathesis, ruff, mypy).
$(TEST_STAMP): $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[ckpt,dev]'
	@touch $(TEST_STAMP)

run: $(RUN_STAMP)
	$(PY) manage.py runconsole

# The gate: ruff's rule families (pyproject.toml says which, and why any rule is off) and its
# formatter, the layering (lint-imports: pyproject.toml's import contracts), then the types (mypy:
# the apps with the bodies of unannotated functions, the process seams strictly; ckptlib and the
# client strictly). A new warning fails it.
lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy --config-file mypy.ini
	$(VENV)/bin/mypy --config-file .mypy/strict.ini

# The gate, the whole suite on SQLite, the browser tests again with the console on a one-host Slurm
# cluster (skipped, saying why, where Slurm or root is missing) and the apps' database tests again
# on PostgreSQL where one answers: harness/lane_runner.py runs these lanes in two streams, one for what
# waits on containers, consoles and clusters and one (niced) for what computes, and prints each
# lane's time (LANE_TIMES collects them for .ci/run's summary). Logs: var/lanes/<lane>.log.
test: $(TEST_STAMP)
	@$(SERVICES_WARNING)
	@$(PY) harness/lane_runner.py $(LANES_ARGS) $(PYTEST_ARGS)

# The fast lane: ruff's rules, then every test not marked slow, on every core (pytest-xdist); it
# prints its time. `make lint` (the formatter, the import contracts, mypy too) and `make test` do the rest.
# schemathesis's plug-in is the API fuzz module's alone (a slow one, never collected here): its
# import costs each process half a second (0.51 s idle here).
FAST_PYTEST = -m "not slow" -n auto -p no:schemathesis
test-fast: $(TEST_STAMP)
	@$(SERVICES_WARNING)
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check . && \
	$(PY) -m pytest -q -p no:cacheprovider $(FAST_PYTEST) $(PYTEST_ARGS); rc=$$?; \
	echo "make test-fast: $$(( $$(date +%s) - start )) s on $$(nproc) cores"; exit $$rc

clean-venv:
	rm -rf $(VENV)
