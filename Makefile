# Two entry points on a fresh Debian 12 machine: `make demo` and `make test`.
# Both install what they need: Debian's ZooKeeper and a Java runtime, a venv, the project.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test demo system-deps venv lint types proto clean

# Debian 12: `zookeeper` brings the jars (it starts nothing; ordq launches it), `libslf4j-java`
# the slf4j-simple.jar without which ZooKeeper logs nothing, `default-jre-headless` Java 17,
# `postgresql` and `mariadb-server` the servers the outbox and CDC tests start themselves in temp
# folders (the packages' own instances are not used; tests/helpers/postgres.py, mariadb.py).
PG_INITDB := ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
system-deps:
	@if ! command -v java >/dev/null || [ ! -f /usr/share/java/zookeeper.jar ] \
	    || [ ! -f /usr/share/java/slf4j-simple.jar ] || ! $(PG_INITDB) || [ ! -x /usr/sbin/mariadbd ]; then \
	  echo "installing Debian packages: zookeeper, libslf4j-java, Java runtime, postgresql, mariadb-server"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    zookeeper libslf4j-java default-jre-headless postgresql mariadb-server >/dev/null; \
	fi
	@command -v java >/dev/null && [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/slf4j-simple.jar ] \
	  || { echo "Java or the ZooKeeper jars are still missing: apt-get install zookeeper libslf4j-java default-jre-headless"; exit 1; }
	@$(PG_INITDB) || { echo "PostgreSQL is still missing: apt-get install postgresql"; exit 1; }
	@[ -x /usr/sbin/mariadbd ] || { echo "MariaDB is still missing: apt-get install mariadb-server"; exit 1; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check .

types: venv
	$(VENV)/bin/mypy coordinator ordq broker_group sdk

proto: venv
	PATH=$(VENV)/bin:$$PATH bash proto/generate.sh
	git diff --exit-code -- broker_group/wire

# Real ZooKeeper and broker processes; a test that hangs fails after 10 minutes instead of CI.
test: system-deps venv lint types proto
	$(VENV)/bin/pytest -m "not slow" --timeout=600 $(PYTEST_ARGS)

demo: system-deps venv
	$(VENV)/bin/ordq demo

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache .hypothesis
