# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test bench-quick clean

setup: $(STAMP)

# One reproducible install: constraints.txt pins torch to the CPU build so mup's
# torchvision requirement cannot drag in a multi-GB CUDA torch; DS_BUILD_OPS=0
# builds DeepSpeed without CUDA (its small CPU ops are JIT-built on first use).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/hpo run configs/quickstart.yaml

test: setup
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) runs
