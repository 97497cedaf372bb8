# clusterproof: the two commands (README) and a few helpers.
#   make run    the suites against the embedded 7,500-node KWOK cluster (PROFILE=nightly)
#   make test   self-tests + every suite on smoke + the 7,500-node bring-up check
# Both set up first: a venv with pinned Python dependencies, then the binaries built
# from Go modules (cached in ~/.cache/clusterproof): `make test` all of them, `make run`
# only what its run uses (clusterproof.prepare: with ARGS="--kubeconfig K" the mock
# NVML library and Prometheus; with "--kubeconfig K --prometheus-url U" the library only).
# Every run writes under its own directory, out/runs/<run id>/ (clusterproof.core.outputs;
# CLUSTERPROOF_OUTPUT_DIR=DIR puts them elsewhere); out/latest names the newest run.

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PYTEST  := $(PY) -m pytest
PROFILE ?= nightly
ARGS    ?=
RUN     ?=
# Allure's own CLI (Allure 2, reads allure-pytest results), from the npm registry; needs Java.
ALLURE  := npx --yes allure-commandline@2.46.1

.PHONY: run test setup toolchain report bench bench-prometheus clean-clusters upgrade-check lint-workflows

run: $(VENV)/.installed
	$(PY) -m clusterproof.prepare --profile $(PROFILE) $(ARGS)
	$(PYTEST) suites --cp-profile $(PROFILE) $(ARGS)

test: setup
	$(PY) -m clusterproof.prometheus.history --profile smoke
	$(PYTEST) tests --cp-profile smoke
	$(PYTEST) suites --cp-profile smoke
	$(PYTEST) suites/test_cluster_scale.py --cp-profile nightly

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

# The HTML report of the latest run (out/latest), or of the one named: make report RUN=<run id>.
# It goes into that run's directory, out/runs/<run id>/html/. Allure's trend graphs need the
# previous report's history: it is kept in out/history/ between reports (copied into the run's
# results before generating, taken back from the new report afterwards). Delete it to start over.
report:
	@dir=$$($(PY) -m clusterproof.core.outputs run-dir $(RUN)) && hist=$$($(PY) -m clusterproof.core.outputs history) \
	  || exit 2; \
	if [ -d "$$hist" ]; then mkdir -p "$$dir/allure-results/history" && cp -r "$$hist/." "$$dir/allure-results/history/"; fi; \
	echo "$(ALLURE) generate $$dir/allure-results --clean -o $$dir/html"; \
	$(ALLURE) generate "$$dir/allure-results" --clean -o "$$dir/html" || exit 2; \
	rm -rf "$$hist" && cp -r "$$dir/html/history" "$$hist"; \
	echo "open $$dir/html/index.html (history of $$(ls "$$hist" | wc -l) files kept in $$hist)"

# Pre-upgrade validation: PROFILE on an embedded cluster at FROM, then at TO,
# the second compared with the first (two runs, out/runs/<id>-from/ and <id>-to/;
# the table in <id>-to/upgrade.txt; exit 6 on a regression).
FROM ?= v1.34.4
TO   ?= v1.35.4
upgrade-check: setup
	$(PY) -m clusterproof.prometheus.history --profile $(PROFILE)
	$(PY) -m clusterproof.cluster.upgrade --from $(FROM) --to $(TO) --profile $(PROFILE) -- $(ARGS)

# The GitHub Actions workflows, checked by actionlint (built from the module proxy; also a self-test).
lint-workflows: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.toolchain --only actionlint
	$$($(PY) -c 'from clusterproof.cluster import toolchain as t; print(t.ACTIONLINT.path("actionlint"))') -color .github/workflows/*.yml

bench: setup
	$(PY) -m clusterproof.bench.bringup $(ARGS)

bench-prometheus: setup
	$(PY) -m clusterproof.bench.prometheus $(ARGS)

clean-clusters: $(VENV)/.installed
	$(PY) -m clusterproof.cluster.kwok --sweep-all
