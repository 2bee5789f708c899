# One command each: `make demo` sets up and runs the main job on the embedded demo model,
# `make test` sets up and runs the test suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
ARK := $(VENV)/bin/arkinfer

.PHONY: setup test test-all demo clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,gguf,onnx,mlx,coreml]"
	touch $@

test: setup
	$(PY) -m pytest -q -m "not heavy"

test-all: setup
	$(PY) -m pytest -q

demo: setup
	$(ARK) build demo --target host --quant q4_0 --force
	$(ARK) bench dist/demo.host.q4_0 -p 128 -n 32 -r 3
	$(ARK) run demo -p "What is bread made from?" -n 48

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache dist
