# One command each: `make demo` sets up and runs the main job on the embedded demo model,
# `make test` sets up and runs the test suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
ARK := $(VENV)/bin/arkinfer

.PHONY: setup opencl test test-all demo clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,gguf,onnx,mlx,coreml,tvm]"
	touch $@

# Debian's PoCL, a real OpenCL implementation on the CPU: the TVM backend's OpenCL kernels run on it
# in the tests (skipped, with the reason, where it is missing and cannot be installed: not root).
opencl:
	@ldconfig -p | grep -q libpocl || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -q >/dev/null && \
	  apt-get install -y -q --no-install-recommends pocl-opencl-icd ocl-icd-opencl-dev >/dev/null; } || \
	  echo "PoCL not installed (needs root + apt-get): the OpenCL kernel tests will be skipped"

# The conformance suite runs in a process of its own: it peaks near 20 GB, on top of what the
# backends' tests leave in the first process.
test: setup opencl
	$(PY) -m pytest -q -m "not heavy" --ignore=tests/conformance
	$(PY) -m pytest -q -m "not heavy" tests/conformance

test-all: setup opencl
	$(PY) -m pytest -q

demo: setup
	$(ARK) build demo --target host --quant q4_0 --force
	$(ARK) bench dist/demo.host.q4_0 -p 128 -n 32 -r 3
	$(ARK) run demo -p "What is bread made from?" -n 48

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache dist
