# maskbench: every target creates .venv on first use and installs the project into it.
# TORCH pins the local CPU wheel on our machines; a GPU user overrides it, e.g.
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu124 TORCH=torch test
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: report test verify bench publish clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

report: $(STAMP)
	$(PY) -m reports $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

verify: $(STAMP)
	$(PY) -m verify $(ARGS)

# asv against the installed project (no per-commit rebuild); results saved under HEAD's hash.
# OPENBLAS_NUM_THREADS=1 pins NumPy's BLAS (the reference) to one thread, as the benchmarks pin
# torch; it must be set before NumPy loads, hence here and not in asv_bench/.
bench: $(STAMP)
	$(VENV)/bin/asv machine --yes --machine maskbench-local >/dev/null
	OPENBLAS_NUM_THREADS=1 $(VENV)/bin/asv run --python=same --machine maskbench-local \
	    --set-commit-hash $$(git rev-parse HEAD) $(ARGS)

publish: $(STAMP)
	$(VENV)/bin/asv publish

clean:
	rm -rf $(VENV) reports/out .asv
