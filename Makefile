# Two entry points on a fresh Debian 12 machine: `make demo` and `make test`.
# Both install what they need: Debian's ZooKeeper and a Java runtime, a venv, the project.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Debian's own Python 3.11, not whichever `python3` comes first on PATH: Debian builds it with
# PGO and LTO and links libpython into the executable; a python3 built from source without
# them (pyenv's, first on PATH on this project's machines) costs every broker, client and test
# ~15 % more CPU per synchronous send (bench_e2e, docs/BENCHMARKS.md stop 104). The venv is
# made again when it was made by another interpreter.
PYTHON ?= /usr/bin/python3.11
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test test-heavy test-loaded demo demo-cdc demo-mirror system-deps python-deps test-deps venv lint types proto clean

# Installs the Debian packages $(1) with apt-get unless the shell check $(2) already passes,
# then fails clearly if it still does not.
define need_debian
	@if ! ( $(2) ) >/dev/null 2>&1; then \
	  echo "installing Debian packages: $(1)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(1) >/dev/null; \
	fi
	@( $(2) ) >/dev/null 2>&1 || { echo "still missing after apt-get: $(1) (apt-get install $(1))"; exit 1; }
endef

# What ordq needs to run (Debian 12): `zookeeper` brings the jars (it starts nothing; ordq
# launches it), `libslf4j-java` the slf4j-simple.jar without which ZooKeeper logs nothing,
# `default-jre-headless` Java 17.
system-deps:
	$(call need_debian,zookeeper libslf4j-java default-jre-headless,command -v java && \
	  test -f /usr/share/java/zookeeper.jar && test -f /usr/share/java/slf4j-simple.jar)

# The interpreter the venv is made from (PYTHON, above) and its venv module, which Debian ships
# apart (`python3.11-venv`).
python-deps:
	$(call need_debian,python3.11 python3.11-venv,$(PYTHON) -c 'import ensurepip; import venv')

# What only the tests need: `chromium`, the headless browser tests/test_status_page.py loads the
# status page in; `prometheus`, whose promtool checks docs/alerts.yml and the exposed metrics
# (tests/test_metrics.py) and whose server scrapes a cluster for the status page's charts
# (tests/test_status_prometheus.py, heavy); `postgresql` and `mariadb-server`, the servers the outbox and CDC
# tests start themselves in temporary folders (tests/helpers/postgres.py, mariadb.py); `iproute2`
# and `iptables`, the network namespaces and partitions of the lab (ordq/lab/; tests/test_lab.py
# runs where it is root). Where systemd runs, these packages also start their own services,
# which nothing here uses.
test-deps: system-deps
	$(call need_debian,chromium prometheus postgresql mariadb-server iproute2 iptables,command -v chromium && \
	  command -v promtool && command -v prometheus && ls /usr/lib/postgresql/*/bin/initdb && test -x /usr/sbin/mariadbd && \
	  command -v ip && command -v iptables)

# The stamp names the interpreter, so a venv of another one (a checkout's before stop 104, or
# PYTHON=... given) is made again from scratch rather than mixed.
VENV_STAMP := $(VENV)/.installed-$(subst /,_,$(PYTHON))
$(VENV_STAMP): pyproject.toml | python-deps
	@if [ -e $(PY) ] && [ "$$(readlink -f $(PY))" != "$$(readlink -f "$$(command -v $(PYTHON))")" ]; then \
	  echo "$(VENV) was made by $$(readlink -f $(PY)), not $(PYTHON): making it again"; \
	  rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $@

venv: $(VENV_STAMP)

# ruff, then the import contracts of pyproject.toml: the layers import only downward and no
# module imports back a module that imports it (docs/CONTRIBUTING.md).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

types: venv
	$(VENV)/bin/mypy ordq bench

proto: venv
	PATH=$(VENV)/bin:$$PATH bash proto/generate.sh
	git diff --exit-code -- ordq/wire

# Real ZooKeeper and broker processes; a test that hangs fails after 10 minutes instead of CI.
# Most of a test's time is spent waiting (sessions expiring, processes starting), so test files
# run in $(TEST_WORKERS) worker processes, each with its own ZooKeeper (--dist loadgroup with the
# groups tests/conftest.py gives: a file's tests, and its module-scoped clusters, stay in one
# worker; the long docs tests are spread). TEST_WORKERS=0: one process.
# `make test` leaves out the end-to-end tier (marker `heavy`: Spark, the docs' walkthroughs,
# benches, the wheel, database servers; tests/conftest.py) to stay under 15 minutes on two
# cores; `make test-heavy` runs that tier, and CI (.ci/run) runs both.
TEST_WORKERS ?= 2
# The slowest tests are listed at the end of each run: the default run is near its 15 minutes.
PYTEST_ARGS ?= --durations=25
test: test-deps venv lint types proto
	$(VENV)/bin/pytest -m "not slow and not heavy" --timeout=600 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-heavy: test-deps venv
	$(VENV)/bin/pytest -m "heavy and not slow" --timeout=1200 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The default suite beside $(BUSY_PROCS) busy-loop processes (issue 26: under load the product is
# slower, never stuck, never wrong). bench/busy.py stops the loops when the suite ends or is
# killed, and prints the run's time and peak load average.
BUSY_PROCS ?= 6
test-loaded: test-deps venv
	$(PY) -m bench.busy --procs $(BUSY_PROCS) --seconds 10800 -- \
	  $(VENV)/bin/pytest -m "not slow and not heavy" --timeout=1200 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

demo: system-deps venv
	$(VENV)/bin/ordq demo

# The CDC path live: MariaDB -> ordq cdc mysql -> queue -> ordq cdc apply -> PostgreSQL, with kills.
demo-cdc: test-deps venv
	$(VENV)/bin/ordq demo --cdc

# The CDC path across two data centres (two local clusters): MariaDB -> ordq cdc mysql -> queue
# -> ordq mirror -> queue in centre 2 -> ordq cdc apply -> PostgreSQL, with kills and a link cut
# (iptables: run as root).
demo-mirror: test-deps venv
	$(VENV)/bin/ordq demo --mirror

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache .hypothesis
