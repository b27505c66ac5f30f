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
# `chromium` the headless browser tests/test_status_page.py loads the status page in,
# `prometheus` the promtool that checks docs/alerts.yml and the exposed metrics (tests/test_metrics.py;
# where systemd runs, the package also starts a Prometheus server on :9090 — nothing here uses it).
system-deps:
	@if ! command -v java >/dev/null || [ ! -f /usr/share/java/zookeeper.jar ] \
	    || [ ! -f /usr/share/java/slf4j-simple.jar ] || ! command -v chromium >/dev/null || ! command -v promtool >/dev/null; then \
	  echo "installing Debian packages: zookeeper, libslf4j-java, Java runtime, chromium, prometheus"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    zookeeper libslf4j-java default-jre-headless chromium prometheus >/dev/null; \
	fi
	@command -v java >/dev/null && [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/slf4j-simple.jar ] \
	  && command -v chromium >/dev/null && command -v promtool >/dev/null \
	  || { echo "Java, the ZooKeeper jars, chromium or promtool are still missing: apt-get install zookeeper libslf4j-java default-jre-headless chromium prometheus"; exit 1; }

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
