# The two commands that do everything on a fresh machine:
#   make demo   serve SmolLM2-135M-Instruct with and without tree speculation, print the speedup
#   make test   run the test suite
VENV ?= $(CURDIR)/.venv
export TREESPEC_VENV := $(VENV)
PYTEST_ARGS ?=

.PHONY: demo demo-code-lm test env bench clean

env:
	@bash scripts/bootstrap.sh

demo: env
	$(VENV)/bin/python benchmarks/demo.py

demo-code-lm: env
	$(VENV)/bin/python benchmarks/demo.py --target code-lm

test: env
	$(VENV)/bin/python -m pytest -q -ra --durations=25 $(PYTEST_ARGS)

bench: env
	$(VENV)/bin/python benchmarks/bench_serving.py

clean:
	rm -rf build vllm_treespec/_C*.so *.egg-info
