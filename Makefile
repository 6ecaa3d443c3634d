# The two commands: `make run` serves the console, `make test` runs the suite.
# Both create .venv/ and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test clean-venv

$(STAMP): pyproject.toml client/pyproject.toml
	@# Jobs run in Podman containers, images come from a local registry and the default image is
	@# built from Debian packages: install the tools where we may (root with apt), else say so.
	@missing=""; for t in podman runc skopeo mmdebstrap docker-registry catatonit; do \
	  command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }; }; } || \
	  echo "WARNING:$$missing not installed: jobs will not run until they are (as root: apt-get install$$missing) or JOB_SANDBOX=off is set."; \
	fi
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
