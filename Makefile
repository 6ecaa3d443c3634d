# The two commands: `make run` serves the console, `make test` runs the suite.
# Both create .venv/ and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test clean-venv

$(STAMP): pyproject.toml client/pyproject.toml
	@# Jobs run in a bubblewrap sandbox: install it where we may (root with apt), else say so.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } || \
	  echo "WARNING: bubblewrap (bwrap) is not installed: jobs will not run until it is (apt-get install bubblewrap) or JOB_SANDBOX=off is set."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch first, pinned, so nothing pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	# The command-line client (its own package, no Django): `satrain` on the venv's PATH.
	$(PY) -m pip install --quiet -e ./client
	@touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py runconsole

# The whole suite on SQLite, then its database tests again on PostgreSQL where one answers.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)
	$(PY) -m console.tests.pg_pass $(PYTEST_ARGS)


clean-venv:
	rm -rf $(VENV)
