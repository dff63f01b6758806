# Every target sets up its own virtualenv, so each works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint format bench airflow-venv airflow-lock browser peer

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip uv

setup: $(BIN)/python
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode -e '.[test]'
	$(BIN)/python -m compileall -q beam_pipeline transforms  # the editable sources too (bytecode: see benchmarks/README.md)

demo: setup
	$(BIN)/img2tfrecord demo --data_dir demo_data --output_dir demo_out

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint airflow-venv browser peer
	$(BIN)/python -m pytest -n 2 -q tests

# The HTML report is checked in a real browser (tests/readers/): Debian's chromium, installed
# here with apt-get when it is missing and this is root on a Debian-like machine (as in CI);
# elsewhere, or with `make test NO_BROWSER=1`, the two browser tests say they were skipped.
browser:
ifdef NO_BROWSER
	@echo "NO_BROWSER is set: chromium is not installed (the browser tests run only if it already is)"
else
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing chromium with apt-get for the HTML report's browser tests (skip: make test NO_BROWSER=1)" && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium is not installed: the browser tests of the HTML report will be skipped"
endif

# The Model Garden (tf-models-official) as a peer: its TfExampleDecoder reads our detection records in
# the tests and its official/vision/data/create_coco_tf_record.py is the benchmarks' peer. Installed without its
# dependencies into a folder of its own, put on sys.path only in a subprocess, so the product's
# environment never imports it (/work/shared/notes/model-garden-peer.md). Installed when missing.
PEER ?= .peer
PEER_PACKAGES := tf-models-official==2.20.0 tf-keras==2.21.0 pycocotools==2.0.11 gin-config scipy \
	opencv-python-headless matplotlib cycler kiwisolver fonttools

peer: $(PEER)/.installed

$(PEER)/.installed: | $(BIN)/python
	rm -rf $(PEER)
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps --target $(PEER) $(PEER_PACKAGES)
	touch $@

bench: setup
	$(BIN)/python benchmarks/run.py

# Airflow lives in its own venv (its pins clash with the project's); tests/cloud/test_cloud_airflow.py
# runs the DAGs with it. Rebuilt only when the lock file changes.
AIRFLOW_VENV ?= .airflow-venv

airflow-venv: $(AIRFLOW_VENV)/.installed

$(AIRFLOW_VENV)/.installed: requirements-airflow.txt | $(BIN)/python
	rm -rf $(AIRFLOW_VENV)
	$(BIN)/uv venv -q --python $(PYTHON) $(AIRFLOW_VENV)
	$(BIN)/uv pip install -q --python $(AIRFLOW_VENV)/bin/python -r requirements-airflow.txt
	touch $@

airflow-lock: $(BIN)/python
	$(BIN)/uv pip compile -q --python-version 3.11 requirements-airflow.in -o requirements-airflow.txt
