# The two commands a newcomer runs: `make run` and `make test` (`make test-fast` while editing).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup lock run test test-fast test-slow clean

setup: $(STAMP)

# One reproducible install of every extra: constraints.txt is the lock (the whole resolved set,
# torch pinned to the CPU build so mup's torchvision requirement cannot drag in a multi-GB CUDA
# torch); DS_BUILD_OPS=0 builds DeepSpeed without CUDA (its small CPU ops are JIT-built on first use).
# The one CPU op every DeepSpeed pipeline loads (shared-memory comm, on a process's first
# init_distributed: 40-60 s on 2 cores) is built here once, into the venv (pipeline_bubble/cpu_ops.py:
# never into the per-user cache, where a killed build's lock once hung CI for its whole 90 minutes),
# and never for longer than 20 minutes: a pipeline builds it on first use if this step could not.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[all,test]'
	timeout 1200 $(VENV)/bin/python -c "from pipeline_bubble.cpu_ops import build_pipeline_op as b; print('DeepSpeed CPU op built in', b())" \
	|| echo "note: DeepSpeed's CPU op did not build here (a C++ compiler?); pipeline-bubble runs build it on first use"
	touch $(STAMP)

# Re-resolve the lock after changing dependencies in pyproject.toml or the hand pins in constraints.in.
# Any Python 3.11 with pip >= 22.2 resolves it; no venv needed.
lock:
	$(PYTHON) tools/lock_constraints.py

run: setup
	$(VENV)/bin/hpo run configs/quickstart.yaml

# Everything, as CI runs it: the fast tier and the slow multi-process / multi-node tier.
test: setup
	$(VENV)/bin/python -m pytest -q --durations=30

# The fast tier (under 3 minutes on 2 cores): no test marked slow.
test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not slow"

# The slow tier alone: real DeepSpeed pipelines, Ray clusters, Tune sweeps.
test-slow: setup
	$(VENV)/bin/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
