# Every target sets up its own virtualenv, so each works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint format bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip uv

setup: $(BIN)/python
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode -e '.[test]'

demo: setup
	$(BIN)/img2tfrecord demo --data_dir demo_data --output_dir demo_out

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint
	$(BIN)/python -m pytest -n 2 -q tests

bench: setup
	$(BIN)/python benchmarks/run.py
