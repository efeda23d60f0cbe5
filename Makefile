# Every target installs what it needs on a fresh Debian machine (run as root).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_TOOLS := systemd-container mmdebstrap iptables openssh-client
HOSTS ?= 1
KEEP ?= 0

.PHONY: setup test unit demo bench up down status clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

.PHONY: .apt-tools
.apt-tools:
	@missing=""; for p in $(APT_TOOLS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "apt: installing$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

setup: $(VENV)/.installed .apt-tools

## make test: unit tests (facts, operations, spec, stand-ins) + sandbox integration tests
test: setup
	$(PY) -m pytest -q

unit: $(VENV)/.installed
	$(PY) -m pytest -q tests/unit

## make demo: boot a sandbox GPU host and converge it (KEEP=1 leaves it running)
demo: setup
	$(PY) -m demo --hosts $(HOSTS) $(if $(filter 1,$(KEEP)),--keep,)

bench: setup
	$(PY) -m bench

up: setup
	$(PY) -m sandbox up --hosts $(HOSTS)

down: $(VENV)/.installed
	$(PY) -m sandbox down

status: $(VENV)/.installed
	$(PY) -m sandbox status

clean: down
	rm -rf $(VENV)
