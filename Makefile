# Two commands for a fresh Debian/Ubuntu machine, as root:
#   make demo   the sandbox cluster up, site.yml on it, bench.yml on the tiny model, then serve.yml
#   make test   the whole test suite (unit, lint, integration on the sandbox)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# The sandbox shaped like Glows (nodes reach each other through SSH only); inventory/sandbox.yml is the flat one.
SANDBOX_INVENTORY ?= inventory/sandbox-mapped.yml
# A prima.cpp mirror that holds the pinned tree under another commit: PRIMA_CPP_VERSION names it (as in the tests).
SANDBOX := -i $(SANDBOX_INVENTORY) $(if $(PRIMA_CPP_VERSION),-e prima_version=$(PRIMA_CPP_VERSION))
PYTEST_ARGS ?=

.PHONY: help venv lock collection host-deps demo test unit lint figures ready sandbox-up sandbox-down sandbox-purge site-sandbox bench-sandbox serve-sandbox variables test-deps

# Every target, one line each (tests/unit/test_makefile.py fails on a target missing here).
help:
	@echo "make demo           sandbox cluster up, site.yml on it, bench.yml (prints the report), serve.yml (a curl)"
	@echo "make test           the whole suite (unit, lint, integration on the sandbox)"
	@echo "make unit | lint    parts of it"
	@echo "make figures        the benchmarks' figures into artifacts/ (on the sandbox, up: make sandbox-up)"
	@echo "make ready          is every node ready? (INVENTORY=inventory/glows.yml; JUnit XML in artifacts/)"
	@echo "make sandbox-up | sandbox-down | sandbox-purge"
	@echo "                    the sandbox cluster up (fresh nodes), down, down with its caches (SANDBOX_INVENTORY)"
	@echo "make site-sandbox | bench-sandbox | serve-sandbox"
	@echo "                    the demo's steps one at a time: site.yml, bench.yml (-e runtime=all), serve.yml"
	@echo "make collection     build the collection tarball prima-cluster-<version>.tar.gz into artifacts/"
	@echo "make variables      the README's tables of variables, made again from meta/ and the roles' argument specs"
	@echo "make venv           .venv from requirements.lock (after make host-deps)"
	@echo "make host-deps      what the controller needs from the distribution: python3-venv, ssh, sshpass"
	@echo "make test-deps      what the suite needs besides: an sshd binary for the transport's forwarding test"
	@echo "make lock           refresh requirements.lock (exact versions) from requirements.txt's ranges"
	@echo "make help           this list"

# What the controller needs from the distribution: a Python with venv, ssh, and sshpass
# for the first (password) contact with a Glows node.
host-deps:
	@if ! $(PYTHON) -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
	  echo "installing python3-venv (the controller needs Python >= 3.11 with venv)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv; \
	fi
	@command -v ssh >/dev/null && command -v sshpass >/dev/null || \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-client sshpass)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "the controller needs Python >= 3.11, found " + sys.version.split()[0]'

venv: $(VENV)/.installed

# The exact versions of requirements.lock (pip-compile made it from requirements.txt's ranges).
$(VENV)/.installed: requirements.lock | host-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	touch $@

# After a change to requirements.txt: pin every package again, then `make venv` installs the new set.
lock: venv
	$(BIN)/pip install -q pip-tools
	$(BIN)/pip-compile -q --strip-extras --no-emit-index-url --no-emit-find-links --upgrade \
	  --output-file requirements.lock requirements.txt

# The collection as a tarball (ansible-galaxy collection install artifacts/prima-cluster-*.tar.gz).
collection: venv
	@mkdir -p artifacts
	$(BIN)/ansible-galaxy collection build --force --output-path artifacts .

sandbox-up: venv
	$(BIN)/ansible-playbook $(SANDBOX) playbooks/sandbox.yml -e sandbox_state=up

sandbox-down: venv
	$(BIN)/ansible-playbook $(SANDBOX) playbooks/sandbox.yml -e sandbox_state=down

sandbox-purge: venv
	$(BIN)/ansible-playbook $(SANDBOX) playbooks/sandbox.yml -e sandbox_state=purge

site-sandbox: venv
	$(BIN)/ansible-playbook $(SANDBOX) site.yml

# Every runtime built on the sandbox (prima.cpp only with PRIMA_CPP_MIRROR), tiny model; the
# callback prints the main table and writes reports/<run-id>/report.md.
bench-sandbox: venv
	$(BIN)/ansible-playbook $(SANDBOX) bench.yml -e model=tiny -e runtime=all

# The ring as a server (prima.cpp where it is built, else llama.cpp RPC); prints the tunnel and a curl that works.
serve-sandbox: venv
	$(BIN)/ansible-playbook $(SANDBOX) serve.yml -e model=tiny -e runtime=$(if $(PRIMA_CPP_MIRROR),prima,llama_rpc)

# prima.cpp is only on GitHub: tools/prima-mirror.sh finds or fetches (once, into ~/.cache) a
# mirror of the pinned commit, or prints nothing and a NOTICE, and the demo runs without prima.cpp.
# The steps run in order within one sub-make so all of them see the same PRIMA_CPP_MIRROR;
# a later step (serving, say) goes at the end of that list.
DEMO_STEPS := sandbox-up site-sandbox bench-sandbox serve-sandbox
demo:
	@prima_mirror=$$(tools/prima-mirror.sh) && \
	  PRIMA_CPP_MIRROR="$$prima_mirror" $(MAKE) --no-print-directory -j1 $(DEMO_STEPS)
	@echo "The sandbox cluster is provisioned, benchmarked (reports/) and serving (the tunnel and curl above)."
	@echo "Stop the server: $(BIN)/ansible-playbook $(SANDBOX) serve.yml -e state=stopped; the sandbox: make sandbox-down"

# Is every node of INVENTORY ready for a benchmark? Per node and per check: pass, or fail with
# the reason; JUnit XML for CI in artifacts/readiness.xml.
INVENTORY ?= inventory/glows.yml
ready: venv
	@mkdir -p artifacts
	$(BIN)/pytest tests/readiness --hosts='ansible://all' --ansible-inventory=$(INVENTORY) \
	  --junitxml=artifacts/readiness.xml -p no:cacheprovider -q \
	  $(if $(PRIMA_CPP_VERSION),--readiness-var=prima_version=$(PRIMA_CPP_VERSION)) $(PYTEST_ARGS)

# The README's tables of variables (between <!-- variables:begin --> and <!-- variables:end -->), made again from
# meta/extra_vars.yml and every role's meta/argument_specs.yml; tests/unit/test_variables_table.py holds them equal.
variables: venv
	$(BIN)/python tools/variables_table.py --write README.md

# The figures that take minutes of runs to make, kept out of make test (which runs each benchmark's path once, on
# fewer runs): bench.yml's overhead per measured run in both modes (every runtime, five runs), the SSH transport
# against direct, weights fan-out against every node downloading, the parsers' speed, and the cost growth from 3
# to 6 nodes. The sandbox must be up; site.yml first makes sure it is provisioned.
figures: site-sandbox
	@mkdir -p artifacts
	$(BIN)/python benchmarks/bench_overhead.py --runtime all --runs 5 --inventory $(SANDBOX_INVENTORY)
	$(BIN)/python benchmarks/tunnel_cost.py --runs 5
	$(BIN)/python benchmarks/models_fanout.py --hub-rate 20mbit
	$(BIN)/python benchmarks/rpc_cache.py --links 200mbit
	# After rpc_cache.py, which puts the large model on the nodes.
	$(BIN)/python benchmarks/tunnel_cost.py --runs 3 --model large
	$(BIN)/python benchmarks/parser_speed.py | tee artifacts/parser-speed.json
	# Copies of n0 as 3 and 6 nodes beside cluster a (tools/sandbox_scale.py), removed at the end.
	$(BIN)/python benchmarks/scale.py --nodes 3,6

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: venv
	$(BIN)/pytest tests/lint $(PYTEST_ARGS)

# The transport's forwarding test (tests/unit/test_transport_sshd.py) starts a real sshd of its own on loopback:
# the binary only, never the service (policy-rc.d, kept or made for the install, stops the package starting one).
test-deps:
	@test -x /usr/sbin/sshd || { \
	  made_policy=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; \
	    chmod 755 /usr/sbin/policy-rc.d; made_policy=1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server; \
	  rc=$$?; [ -z "$$made_policy" ] || rm -f /usr/sbin/policy-rc.d; exit $$rc; }

# Two pytests side by side (tools/run_tests.sh): the integration suite on the sandbox, the rest beside it.
test: venv test-deps
	BIN=$(BIN) tools/run_tests.sh $(PYTEST_ARGS)
