# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in .venv with pinned versions.
VENV   ?= .venv
# The interpreter that creates the venv: 3.11 by default (the one CI runs); fedfair also
# supports 3.12 and 3.13, e.g. `make setup PYTHON=python3.13 VENV=.venv313`.
PYTHON ?= python3.11
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fedfair-installed

.PHONY: setup wheel demo format lint types check api bytecode suite test test-fast test-studies test-flower bench bench-round clean

# Test workers: the suite's processes and federations are independent, so two workers fill 2 cores.
WORKERS ?= 2
# The packages the API reference covers (`make api` writes build/api/index.html).
API_MODULES := fedfair.api fedfair.core fedfair.simulation fedfair.secagg fedfair.privacy fedfair.fairness fedfair.pki \
               fedfair.datasets fedfair.bundle fedfair.runtime fedfair.research

setup: $(STAMP)

# A .venv made before the distribution was renamed fedfair-rcvar lists the old name "fedfair", whose
# record would later take the `fedfair` command with it: it goes first.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip uninstall --quiet --yes fedfair 2>/dev/null || true
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,ray]'
	touch $(STAMP)

# The wheel a site installs without the checkout: dist/fedfair_rcvar-VERSION-py3-none-any.whl
# (the distribution is fedfair-rcvar; the import and the command stay `fedfair`).
wheel: setup
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w dist .

# A whole federation on this machine; the workspace (report, logs, model) is kept where it says.
demo: setup
	$(PY) -m fedfair.cli launch --keep

# The code ruff formats (`make format` rewrites it; `make check` only checks it).
FORMATTED := fedfair tests benchmarks examples docs/layout.py

format: setup
	$(PY) -m ruff format $(FORMATTED)

# The formatter's layout (seconds), then ruff's rules: docstrings (pydocstyle, Google convention:
# every public name documented, a one-line summary; tests and benchmarks exempt) and pyflakes.
lint: setup
	$(PY) -m ruff format --check $(FORMATTED)
	$(PY) -m ruff check $(FORMATTED)

# Static types: mypy (strict, configured in pyproject.toml) must find nothing.
types: setup
	$(PY) -m mypy

# Lint, types, and the API reference, which must build from the docstrings: pdoc fails on a module it
# cannot import, and any warning but an annotation it cannot evaluate (names imported only for type
# checking) fails the check.
check: lint types api

# fedfair.bundle and fedfair.datasets import their names on first use (so `--help` loads no PyTorch);
# pdoc reads a module's dict, so the names are resolved into it before pdoc runs.
export PDOC_WITH_LAZY_NAMES = import importlib, sys; from pdoc.__main__ import cli; \
  packages = [importlib.import_module(name) for name in ("fedfair.bundle", "fedfair.datasets")]; \
  [vars(package).setdefault(name, getattr(package, name)) for package in packages for name in package.__all__]; \
  cli(sys.argv[1:])

# Importing matplotlib builds its font cache on a fresh machine by running fc-list, which pdoc
# refuses (a warning that fails the check); build the cache first.
api: setup
	mkdir -p build
	$(PY) -c "import matplotlib.font_manager"
	$(PY) -c "$$PDOC_WITH_LAZY_NAMES" $(API_MODULES) -o build/api 2> build/api-warnings.txt
	! grep -v "Error parsing type annotation" build/api-warnings.txt

# The suite starts hundreds of Python processes; where PYTHONDONTWRITEBYTECODE is set, each would
# compile fedfair again (about 5% of the suite's CPU), so its bytecode is written once first.
bytecode: setup
	$(PY) -m compileall -q fedfair benchmarks

# The whole suite on $(WORKERS) workers, but the study re-runs (marked `study`: pyproject.toml's addopts
# leaves them out; `make test-studies` runs them). Its budget: 600 CPU-seconds on a fresh clone.
suite: bytecode
	$(PY) -m pytest -q -n $(WORKERS) --dist worksteal -m "not study"

# Everything `check` does, and the suite. The suite's federations leave a core idle while they wait
# on the network and on each other, so mypy and pdoc run beside it (lint first: it fails in seconds);
# each line of the three comes out whole.
test: lint
	$(MAKE) --no-print-directory --jobs=3 --output-sync=line types api suite

# The edit-test loop: every test but the end-to-end ones marked slow (live federations, processes,
# many rounds), no mypy; under a minute on 2 cores. `make test` runs them all, but the studies.
test-fast: bytecode
	$(PY) -m pytest -q -n $(WORKERS) --dist worksteal -m "not slow and not study"

# The checks that re-run committed studies (marked `study`): each trains a study's runs again on this tree,
# a minute or more of CPU apiece, and holds them to the figures docs/figures/ and docs/paper.md show; and
# those that re-run a benchmark's federations (the attack matrix's groups but the one `make test` keeps,
# round_bench with processes, federation_bench: 10 to 50 CPU-seconds apiece). Run them after a change to
# training, models, the studies or the runtime; `make test` leaves them out.
test-studies: bytecode
	$(PY) -m pytest -q -n $(WORKERS) --dist worksteal -m study

# fedfair.flower (the [flower] extra, docs/flower.md) needs Flower, which pins protobuf < 7 and ray 2.55.1 where
# fedfair pins protobuf 7 (its generated wire code needs 7) and a newer ray: its tests run in an environment of
# their own, made as a site makes it: the wheel installed with [flower] (pins: constraints-flower.txt), then this
# tree over it, editable, so that the tests and Flower's worker processes run the checkout. Then mypy checks
# fedfair.flower against Flower's own types, and tests/flower runs (the main suite skips it).
FLOWER_VENV  ?= .venv-flower
FLOWER_PY    := $(FLOWER_VENV)/bin/python
FLOWER_STAMP := $(FLOWER_VENV)/.fedfair-installed
VERSION       = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' fedfair/__init__.py)

$(FLOWER_STAMP): pyproject.toml constraints-flower.txt
	$(MAKE) --no-print-directory wheel
	test -x $(FLOWER_PY) || $(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_PY) -m pip install --quiet --disable-pip-version-check -c constraints-flower.txt \
	  "dist/fedfair_rcvar-$(VERSION)-py3-none-any.whl[flower]" pytest pytest-timeout hypothesis mypy
	$(FLOWER_PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(FLOWER_STAMP)

test-flower: $(FLOWER_STAMP)
	$(FLOWER_PY) -m mypy fedfair/flower
	$(FLOWER_PY) -m pytest -q -p no:cacheprovider tests/flower

# docs/benchmarks.md is generated from benchmarks/results/*.json; each file records the command that
# measured it (variants included: --quick, 16-bit words, d = 10^8), and `bench` runs every one of those
# commands again (`benchmarks/rerun.py --list` prints them; ONLY="NAME ..." reruns some), then the page.
ONLY ?=
bench: setup
	$(PY) benchmarks/rerun.py $(if $(ONLY),--only $(ONLY))
	$(PY) benchmarks/report.py

# A secure round's CPU per party (user and system), each party step's and the peak memory against the pinned
# reference commit (benchmarks/round_compare.py --paired: d = 10^6 at n = 10 and d = 10^7 at n = 3, both trees at
# once taking turns round by round, 3 runs of 8 paired rounds, CPU seconds), its ratios with their intervals printed
# and kept in benchmarks/results/round_compare_paired.json; about 14 minutes on 2 cores. Run it after a change to
# the secure round's path (secagg, the collaborator's steps and chain, the transport) and before merging it. The
# plain rounds and the live peaks: round_compare.py without --paired (results/round_compare.json).
ROUND_REFERENCE ?= 6692f28
bench-round: setup
	nice $(PY) benchmarks/round_compare.py --paired --reference $(ROUND_REFERENCE) \
	  --json benchmarks/results/round_compare_paired.json

clean:
	rm -rf $(VENV) $(FLOWER_VENV) build *.egg-info
