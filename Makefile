# Every target installs what it needs on a fresh Debian machine (run as root).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_TOOLS := systemd-container mmdebstrap iptables openssh-client gcc libc6-dev curl rsync
HOSTS ?= 1
KEEP ?= 0

.PHONY: setup test test-venvs lint unit demo bench up down status clean

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

# The project's bytecode, written here because a shell with PYTHONDONTWRITEBYTECODE set never writes
# it: every pyinfra run then compiled deploy.py's ~60 modules again (0.3-0.5 s of a 1.5 s no-op re-run).
# compileall rewrites only what changed since; python itself keeps it fresh where it may write.
PROJECT_PACKAGES := core facts tasks rollout sandbox remote bench
setup: $(VENV)/.installed .apt-tools
	@$(PY) -m compileall -q $(PROJECT_PACKAGES)

# torch is installed uncompiled (all ~3,000 modules: ~13 s); importing once what the tests' children import
# writes the bytecode of those alone. Written here, as for the project's packages above: where
# PYTHONDONTWRITEBYTECODE is set (CI's shell), every child would otherwise compile torch again on import
# (`import torch, transformers` measured 5.1 s of CPU without bytecode, 2.9 s with it).
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

# Venvs the stand-in's unit tests run under: SGLang's real parser (sglang
# without its CUDA deps, beside the machine's CPU torch) and compressed-tensors 0.8.1.
# The first (torch, transformers, gguf) also converts the real pretrained model the sandbox Hub
# serves (sandbox/smollm2.py): whatever starts the Hub needs it (HUB_VENV).
PARSER_DEPS := msgspec==0.23.0 numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 \
	requests==2.34.2 packaging==26.4 pillow==13.0.0 zstandard==0.25.0 starlette==1.10.0 \
	pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5 pyyaml==6.0.4 triton==3.9.0 \
	safetensors==0.8.0 huggingface_hub==1.33.0 compressed-tensors==0.18.0 transformers==5.19.0 gguf==0.19.0
.sandbox/sglang-venv/.installed: Makefile
	$(PYTHON) -m venv .sandbox/sglang-venv
	.sandbox/sglang-venv/bin/pip install -q --no-compile torch==2.13.0
	.sandbox/sglang-venv/bin/pip install -q --no-deps sglang==0.5.23
	.sandbox/sglang-venv/bin/pip install -q $(PARSER_DEPS)
	$(WRITE_BYTECODE) .sandbox/sglang-venv/bin/python -c 'import torch, transformers, compressed_tensors, sglang.srt.server_args'
	touch $@

.sandbox/ct-venv/.installed:
	$(PYTHON) -m venv .sandbox/ct-venv
	.sandbox/ct-venv/bin/pip install -q --no-compile torch==2.13.0 compressed-tensors==0.8.1
	$(WRITE_BYTECODE) .sandbox/ct-venv/bin/python -c 'import torch, compressed_tensors'
	touch $@

# pynvml (nvidia-ml-py, the release sglang 0.5.23 depends on) against the sandbox's simulated libnvidia-ml.so.1
.sandbox/nvml-venv/.installed:
	$(PYTHON) -m venv .sandbox/nvml-venv
	.sandbox/nvml-venv/bin/pip install -q nvidia-ml-py==13.615.71
	touch $@

HUB_VENV := .sandbox/sglang-venv/.installed
test-venvs: .sandbox/sglang-venv/.installed .sandbox/ct-venv/.installed .sandbox/nvml-venv/.installed

## make test: lint (ruff, mypy), unit tests (facts, operations, spec, stand-ins) + sandbox integration tests.
## Lint, the stand-ins' test venvs and the unit tests (CPU, loopback only) run beside the integration
## tests, which mostly wait on the sandbox hosts, at a low priority (nice 15: the sandbox hosts' timed
## starts and ssh handshakes come first on a 2-core machine); their output follows the integration tests' (in
## REPORTS/unit-tests.log). The integration tests run on WORKERS pytest-xdist workers (default 3), each
## taking whole groups (a module, or the modules that share hosts: tests/conftest.py), then the tests that
## remove every host (marker runs_last) run alone. Each phase's seconds and the JUnit reports go to
## REPORTS (default .sandbox/reports; .ci/report.py prints them). INTEGRATION=... / UNIT=... run a part.
INTEGRATION ?= tests/integration
UNIT ?= tests/unit
WORKERS ?= 3
REPORTS ?= .sandbox/reports
test: setup .sandbox/nvml-venv/.installed $(HUB_VENV)
	@mkdir -p $(REPORTS); rm -f $(REPORTS)/*.xml $(REPORTS)/phases.txt; \
	( s=$$(date +%s); nice -n 15 $(MAKE) --no-print-directory lint test-venvs unit; rc=$$?; \
		echo "lint, test venvs and unit tests (beside the integration tests)	$$(( $$(date +%s) - s ))" >> $(REPORTS)/phases.txt; \
		exit $$rc ) > $(REPORTS)/unit-tests.log 2>&1 & unit=$$!; \
	s=$$(date +%s); \
	export SGC_FAILURES_LOG=$(REPORTS)/failures.log; rm -f $(REPORTS)/failures.log; \
	export SANDBOX_CPU_LOG=$(abspath $(REPORTS))/guest-cpu.tsv; rm -f $(REPORTS)/guest-cpu.tsv; \
	$(PY) -m pytest -q --durations=20 -n $(WORKERS) --dist loadgroup --no-loadscope-reorder -m "not runs_last" \
		--junitxml=$(REPORTS)/integration.xml $(INTEGRATION); integration=$$?; \
	$(PY) -m pytest -q -m runs_last --junitxml=$(REPORTS)/integration-last.xml $(INTEGRATION); last=$$?; \
	[ $$last -eq 5 ] && last=0; [ $$integration -eq 0 ] && integration=$$last; \
	echo "integration tests	$$(( $$(date +%s) - s ))" >> $(REPORTS)/phases.txt; \
	wait $$unit; unit_status=$$?; \
	echo "== lint, test venvs and unit tests (run beside the integration tests) =="; cat $(REPORTS)/unit-tests.log; \
	echo "== integration tests: exit $$integration; lint + unit tests: exit $$unit_status =="; \
	[ $$integration -eq 0 ] && [ $$unit_status -eq 0 ]

## make lint: ruff and mypy, configured in pyproject.toml
lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m mypy

## make unit: the unit tests (UNIT=...), their JUnit report in REPORTS
unit: $(VENV)/.installed
	@mkdir -p $(REPORTS)
	$(PY) -m pytest -q -p no:cacheprovider --junitxml=$(REPORTS)/unit.xml $(UNIT)

## make demo: boot a sandbox GPU host and converge it (KEEP=1 leaves it running; REAL=1: the real
## SGLang server on a sandbox host's CPU, answering a chat request)
REAL ?= 0
demo: setup $(HUB_VENV)
	$(PY) -m sandbox.demo $(if $(filter 1,$(KEEP)),--keep,) $(if $(filter 1,$(REAL)),--real,)

# ansible-core for the bench's no-op comparison only (bench/ansible/noop.yml): its own venv, not a project dependency
ANSIBLE_CORE := ansible-core==2.19.14
.sandbox/ansible-venv/.installed: Makefile
	$(PYTHON) -m venv .sandbox/ansible-venv
	.sandbox/ansible-venv/bin/pip install -q $(ANSIBLE_CORE)
	touch $@

## make bench: every benchmark, then a table of every figure with its goal; PART=noop (report, gates, rollout,
## transfer, seeding, scale) runs one part and keeps the other parts' figures in bench/results/latest.json
## QUICK=1: every part once at its smallest size (figures in .sandbox/bench-quick.json; make test runs it)
PART ?=
QUICK ?= 0
bench: setup .sandbox/ansible-venv/.installed $(HUB_VENV)
	$(PY) -m bench $(foreach p,$(PART),--part $(p)) $(if $(filter 1,$(QUICK)),--quick,)

## make rollout INVENTORY=inventory/sandbox_fleet.py BATCH=2 CANARY=1: rolling rollout of deploy.py (python -m rollout)
INVENTORY ?= inventory/sandbox_fleet.py
BATCH ?= 1
CANARY ?= 1
.PHONY: rollout
rollout: setup $(HUB_VENV)
	$(PY) -m rollout $(INVENTORY) --batch-size $(BATCH) --canary $(CANARY)

up: setup $(HUB_VENV)
	$(PY) -m sandbox up --hosts $(HOSTS)

down: $(VENV)/.installed
	$(PY) -m sandbox down

status: $(VENV)/.installed
	$(PY) -m sandbox status

clean: down
	rm -rf $(VENV)
