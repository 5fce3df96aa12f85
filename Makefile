# maskbench: every target creates .venv on first use and installs the project into it.
# TORCH pins the local CPU wheel on our machines; a GPU user overrides it, e.g.
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu124 TORCH=torch test
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: report test verify gpu-check bench-ops bench-blocks bench bench-history bench-continuous bench-compare publish bench-preview clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# Measure (measure writes one results JSON; ARGS go to it, e.g. ARGS=--quick), then render
# it and the asv results into reports/out/index.html (python -m reports only draws).
report: $(STAMP)
	$(PY) -m measure --out reports/out/results.json $(ARGS)
	$(PY) -m reports --from-json reports/out/results.json

# The tests in one pytest-xdist worker per core (on 2 cores 8.7 minutes instead of 10.5);
# JOBS=0 runs them in this process (e.g. make test JOBS=0 ARGS="-x --pdb tests/fast").
JOBS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist worksteal $(ARGS)

verify: $(STAMP)
	$(PY) -m verify $(ARGS)

# The GPU run (python -m measure.gpu, docs/methods.md "The GPU run"): the CUDA tests,
# verify --device cuda --quick, time and memory vs N of every fast path and the peer suite on the
# GPU, within BUDGET seconds (8 minutes on one H100), into reports/out/gpu.json; `make report` or
# `python -m reports` renders it as the page's GPU section. Without CUDA it says so and exits 2.
# GPU_PY=python3 runs it with a python that already has a CUDA torch (no venv is made).
GPU_PY ?=
BUDGET ?= 480
gpu-check: $(if $(GPU_PY),,$(STAMP))
	$(or $(GPU_PY),$(PY)) -m measure.gpu --out reports/out/gpu.json --budget $(BUDGET) $(ARGS)

# The peer suite (docs/benchmarks.md, "Peer benchmarks"): each operation of maskbench beside torch
# SDPA and, when installed, performer-pytorch and pytorch-fast-transformers (missing peers skip
# with a message), then the peers summary (ratio = peer / maskbench median time, with a bootstrap
# interval) and its markdown table. ARGS go to pytest, e.g. ARGS=--quick (N in {2^10, 2^12}),
# ARGS="--device cuda", ARGS="--threads 1 --benchmark-min-rounds=20".
bench-ops: $(STAMP)
	mkdir -p benchmarks/out
	$(PY) -m pytest benchmarks --benchmark-enable --benchmark-group-by=group \
	    --benchmark-sort=name --benchmark-columns=median,iqr,min,rounds --benchmark-min-rounds=10 \
	    --benchmark-json benchmarks/out/peers.json $(ARGS)
	$(PY) benchmarks/summary.py benchmarks/out/peers.json --out benchmarks/out/peers-summary.json

bench-blocks: $(STAMP)
	$(PY) -m benchmarks.blocks $(ARGS)

# asv (docs/benchmarks.md). Every target records under one machine name, so that `make bench`,
# per-commit runs and `asv compare` see the same history.
ASV         := $(VENV)/bin/asv
ASV_MACHINE ?= maskbench-local
RANGE       ?= HEAD^!
BASE        ?= HEAD~1

# asv against the installed project (no per-commit rebuild); results saved under HEAD's hash.
# OPENBLAS_NUM_THREADS=1 pins NumPy's BLAS (the reference) to one thread, as the benchmarks pin
# torch; it must be set before NumPy loads (asv_bench/__init__.py sets it too where it can).
bench: $(STAMP)
	$(ASV) machine --yes --machine $(ASV_MACHINE) >/dev/null
	OPENBLAS_NUM_THREADS=1 $(ASV) run --python=same --machine $(ASV_MACHINE) \
	    --set-commit-hash $$(git rev-parse HEAD) $(ARGS)

# Per commit: every commit of RANGE (a git range, e.g. RANGE=HEAD~3..HEAD) is built into asv's
# virtualenv (torch pinned in asv.conf.json's matrix) and benchmarked with this tree's asv_bench.
bench-history: $(STAMP)
	$(ASV) machine --yes --machine $(ASV_MACHINE) >/dev/null
	OPENBLAS_NUM_THREADS=1 $(ASV) run --machine $(ASV_MACHINE) $(ARGS) "$(RANGE)"

# BASE against HEAD, both built per commit; fails when a benchmark got slower (asv continuous).
bench-continuous: $(STAMP)
	$(ASV) machine --yes --machine $(ASV_MACHINE) >/dev/null
	OPENBLAS_NUM_THREADS=1 $(ASV) continuous --machine $(ASV_MACHINE) $(ARGS) "$(BASE)" HEAD

# The table of BASE vs HEAD from results already recorded (no run).
bench-compare: $(STAMP)
	$(ASV) compare --machine $(ASV_MACHINE) $(ARGS) "$(BASE)" HEAD

# asv's HTML in .asv/html, then its libraries served from local npm packages so that the page
# also works offline (asv_bench/offline_html.py; without npm it stays asv's online page).
publish: $(STAMP)
	$(ASV) publish $(ARGS)
	$(PY) -m asv_bench.offline_html --html-dir .asv/html --vendor-dir .asv/www-vendor

# Serve .asv/html on 127.0.0.1 (a page opened as file:// may not read its own data files).
bench-preview: $(STAMP)
	$(ASV) preview $(ARGS)

clean:
	rm -rf $(VENV) reports/out .asv
