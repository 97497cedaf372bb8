# clusterproof: the two commands (README) and a few helpers.
#   make run    the suites against the embedded 7,500-node KWOK cluster (PROFILE=nightly)
#   make test   self-tests + every suite on smoke + the 7,500-node bring-up check
# Both set everything up first: a venv with pinned Python dependencies and the
# control-plane binaries built from Go modules (cached in ~/.cache/clusterproof).

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PYTEST  := $(PY) -m pytest
PROFILE ?= nightly
ARGS    ?=
RESULTS := reports/allure-results
# Allure's own CLI (Allure 2, reads allure-pytest results), from the npm registry; needs Java.
ALLURE  := npx --yes allure-commandline@2.46.1

.PHONY: run test setup toolchain report bench bench-prometheus clean-clusters upgrade-check lint-workflows

run: setup
	rm -rf $(RESULTS)
	$(PY) -m clusterproof.prometheus.history --profile $(PROFILE)
	$(PYTEST) suites --profile $(PROFILE) $(ARGS)

test: setup
	rm -rf $(RESULTS)
	$(PY) -m clusterproof.prometheus.history --profile smoke
	$(PYTEST) tests --profile smoke
	$(PYTEST) suites --profile smoke
	$(PYTEST) suites/test_cluster_scale.py --profile nightly

setup: $(VENV)/.installed toolchain

# The lock (requirements.txt), then clusterproof itself, editable: its pytest11
# entry point and the clusterproof command, running this checkout's code.
$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

toolchain: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.toolchain
	$(PY) -m clusterproof.cluster.hostpkgs --install
	@# the real nodes' images (debootstrap needs root; a run with real nodes builds them, or says why not)
	@if [ "$$(id -u)" = 0 ]; then $(PY) -m clusterproof.cluster.images; else echo "clusterproof: images for real nodes not built (not root)"; fi

# Allure's trend graphs need the previous report's history: it is kept in
# reports/history/ between runs (copied into the results before generating,
# and taken back from the new report afterwards). Delete that folder to start over.
HISTORY := reports/history

report:
	@if [ -d $(HISTORY) ]; then mkdir -p $(RESULTS)/history && cp -r $(HISTORY)/. $(RESULTS)/history/; fi
	$(ALLURE) generate $(RESULTS) --clean -o reports/html
	rm -rf $(HISTORY) && cp -r reports/html/history $(HISTORY)
	@echo "open reports/html/index.html (history of $$(ls $(HISTORY) | wc -l) files kept in $(HISTORY))"

# Pre-upgrade validation: PROFILE on an embedded cluster at FROM, then at TO,
# the second compared with the first (reports/upgrade/, exit 6 on a regression).
FROM ?= v1.34.4
TO   ?= v1.35.4
upgrade-check: setup
	rm -rf $(RESULTS)
	$(PY) -m clusterproof.prometheus.history --profile $(PROFILE)
	$(PY) -m clusterproof.cluster.upgrade --from $(FROM) --to $(TO) --profile $(PROFILE) -- $(ARGS)

# The GitHub Actions workflows, checked by actionlint (built from the module proxy; also a self-test).
lint-workflows: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.toolchain --only actionlint
	$$($(PY) -c 'from fixtures import toolchain as t; print(t.ACTIONLINT.path("actionlint"))') -color .github/workflows/*.yml

bench: setup
	$(PY) -m clusterproof.bench.bringup $(ARGS)

bench-prometheus: setup
	$(PY) -m clusterproof.bench.prometheus $(ARGS)

clean-clusters: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.kwok --sweep-all
