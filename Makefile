# One command each: `make demo` sets up and runs the main job on the embedded demo model,
# `make test` sets up and runs the test suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
ARK := $(VENV)/bin/arkinfer

.PHONY: setup opencl test test-all demo clean

setup: $(VENV)/.installed

# llama-cpp-python compiles llama.cpp with -march=native. On a Xeon with AMX that compiles ggml's
# AMX kernels in, and on this project's 2-core AMX-capable Xeon VM they crash every evaluation
# (SIGSEGV in ggml_backend_amx_mul_mat). So its wheel is built without AMX (AVX-512/AVX2 stay
# native), once per machine, into a folder of its own: pip's wheel cache would hand back an earlier
# native build of the same version. backends/gguf/llamacpp_build.py uses the same flags.
LLAMACPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
LLAMACPP_WHEELS ?= $(HOME)/.cache/arkinfer/wheels/llama-cpp-python-no-amx
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16

$(VENV)/.installed: pyproject.toml setup.py constraints.txt Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	ls $(LLAMACPP_WHEELS)/llama_cpp_python-$(LLAMACPP_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" $(PY) -m pip wheel \
	  --quiet --no-cache-dir --no-deps -w $(LLAMACPP_WHEELS) llama-cpp-python==$(LLAMACPP_VERSION)
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(LLAMACPP_WHEELS)/llama_cpp_python-$(LLAMACPP_VERSION)-*.whl
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
