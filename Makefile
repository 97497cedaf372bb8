# clusterproof: the set-up, and aliases of ./proof (README: `./proof run`, `./proof test`).
#   make run    = ./proof run: the suites against the embedded 7,500-node KWOK cluster (PROFILE=nightly)
#   make test   = ./proof test: self-tests + every suite on smoke + the 7,500-node bring-up check
#   make report = ./proof report RUN: the Allure report of the latest run (or of RUN)
# make exits 2 for ANY failure of a recipe, whatever pytest's own code was (1 a check failed,
# 4 bad input, 6 a regression, 8 set-up failed: docs/exit-codes.md). ./proof passes the code
# through unchanged: call it directly (CI does: .ci/run, .ci/nightly) whenever the code matters.
# The set-up stays here, and ./proof calls it: a venv with pinned Python dependencies (make venv),
# then the binaries built from Go modules (make setup; cached in ~/.cache/clusterproof).
# Every run writes under its own directory, out/runs/<run id>/ (clusterproof.core.outputs;
# CLUSTERPROOF_OUTPUT_DIR=DIR puts them elsewhere); out/latest names the newest run.

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PROFILE ?= nightly
ARGS    ?=
RUN     ?=

.PHONY: run test setup venv toolchain report bench bench-prometheus clean-clusters upgrade-check lint-workflows

run:
	PROFILE="$(PROFILE)" ARGS="$(ARGS)" ./proof run

test:
	./proof test

setup: venv toolchain

venv: $(VENV)/.installed

# The lock (requirements.txt), then clusterproof itself, editable: its pytest11
# entry point and the clusterproof command, running this checkout's code.
$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

toolchain: $(VENV)/.installed
	$(PY) -m clusterproof.provision.toolchain
	$(PY) -m clusterproof.provision.hostpkgs --install
	@# the real nodes' images (debootstrap needs root; a run with real nodes builds them, or says why not)
	@if [ "$$(id -u)" = 0 ]; then $(PY) -m clusterproof.provision.images; else echo "clusterproof: images for real nodes not built (not root)"; fi

# The HTML report of the latest run (out/latest), or of the one named: make report RUN=<run id>,
# built into that run's directory, out/runs/<run id>/html/, with Allure's trend history carried
# over in out/history/ (./proof report says how).
report:
	./proof report $(RUN)

# Pre-upgrade validation: PROFILE on an embedded cluster at FROM, then at TO,
# the second compared with the first (two runs, out/runs/<id>-from/ and <id>-to/;
# the table in <id>-to/upgrade.txt; exit 6 on a regression).
FROM ?= v1.36.3
TO   ?= v1.37.2
upgrade-check: setup
	$(PY) -m clusterproof.prometheus.history --cp-profile $(PROFILE)
	$(PY) -m clusterproof.upgrade --from $(FROM) --to $(TO) --cp-profile $(PROFILE) -- $(ARGS)

# The GitHub Actions workflows, checked by actionlint (built from the module proxy) and audited by zizmor
# (pinned in requirements.txt; offline: its online audits need the GitHub API), both also self-tests
# (tests/test_workflows.py, with the flags and why).
lint-workflows: $(VENV)/.installed
	$(PY) -m clusterproof.provision.toolchain --only actionlint
	$$($(PY) -c 'from clusterproof.provision import toolchain as t; print(t.ACTIONLINT.path("actionlint"))') -color .github/workflows/*.yml
	$(VENV)/bin/zizmor --offline --no-config --persona auditor --strict-collection .github/workflows

bench: setup
	$(PY) -m clusterproof.bench.bringup $(ARGS)

bench-prometheus: setup
	$(PY) -m clusterproof.bench.prometheus $(ARGS)

clean-clusters: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.kwok --sweep-all
