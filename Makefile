# Both entry points set everything up on a fresh machine (a virtualenv in .venv with the pinned stack).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,cuda]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tvmpipe demo

# two workers (pytest-xdist), each test module on one of them (its module fixtures set up once): 2 cores, as CI.
# CI runs `test`: everything but the tests marked slow (the tuning jobs' kill / Ctrl-C / RPC / log tests, the
# low-precision CUDA kernels and the attention tile options only the benchmark takes, emulated); `test-all` runs
# those too.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope -m 'not slow' tests --nbmake notebooks

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope tests --nbmake notebooks

clean:
	rm -rf $(VENV) .pytest_cache
