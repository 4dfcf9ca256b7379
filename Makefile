# The two commands of the README: `make demo` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo engine-demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

demo: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo]'
	$(BIN)/python demo/run_demo.py

engine-demo: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo]'
	$(BIN)/python demo/engine_demo.py

test: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pytest

lint: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/ruff check .

bench: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/run.py --markdown docs/benchmarks.md

clean:
	rm -rf $(VENV) build *.egg-info
