# The two commands a newcomer runs: `make run` and `make test` (`make test-fast` while editing).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
RUN_STAMP := $(VENV)/.quickstart-stamp
STAMP := $(VENV)/.installed-stamp
BUBBLES_STAMP := $(VENV)/.bubbles-stamp

.PHONY: setup setup-bubbles lock run test test-fast test-slow clean

setup: $(STAMP)

# What `make run` needs: hydro-hpo with the example data and the plots, from the lock
# constraints.txt (the whole resolved set, torch pinned to the CPU build so mup's torchvision
# requirement cannot drag in a multi-GB CUDA torch). Not DeepSpeed (built from source), muP, the
# loggers or the test tools, which the quickstart never loads: `make setup` adds them.
$(RUN_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[examples,plots]'
	touch $(RUN_STAMP)

# One reproducible install of every extra, from the same lock; DS_BUILD_OPS=0 builds DeepSpeed
# without CUDA (its small CPU ops are JIT-built on first use).
$(STAMP): $(RUN_STAMP)
	DS_BUILD_OPS=0 $(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[all,test]'
	touch $(STAMP)

# Only for tuning in DeepSpeed pipeline bubbles (and the tests, which run pipelines): the one CPU op
# every DeepSpeed pipeline loads (shared-memory comm, on a process's first init_distributed: 40-60 s
# on 2 cores), built once into the venv (pipeline_bubble/cpu_ops.py: never into the per-user cache,
# where a killed build's lock once hung CI for its whole 90 minutes), and never for longer than
# 20 minutes. Without it the first pipeline-bubble run builds it; `make run` needs none of it.
setup-bubbles: $(BUBBLES_STAMP)

$(BUBBLES_STAMP): $(STAMP)
	timeout 1200 $(VENV)/bin/python -c "from pipeline_bubble.cpu_ops import build_pipeline_op as b; print('DeepSpeed CPU op built in', b())" \
	|| echo "note: DeepSpeed's CPU op did not build here (a C++ compiler?); pipeline-bubble runs build it on first use"
	touch $(BUBBLES_STAMP)

# Re-resolve the lock after changing dependencies in pyproject.toml or the hand pins in constraints.in.
# Any Python 3.11 with pip >= 22.2 resolves it; no venv needed.
lock:
	$(PYTHON) tools/lock_constraints.py

run: $(RUN_STAMP)
	$(VENV)/bin/hpo run configs/quickstart.yaml

# Everything, as CI runs it: the fast tier and the slow multi-process / multi-node tier. Two
# workers (pytest-xdist): most slow tests wait on Ray and on subprocesses, so two overlap well on
# 2 cores. A module runs whole on one worker, in tests/conftest.py's order (its scheduler);
# its RUN_ALONE keeps apart those that must not overlap. `-n 0` runs everything in one process.
TEST_WORKERS := -n 2

test: setup-bubbles
	$(VENV)/bin/python -m pytest -q --durations=30 $(TEST_WORKERS)

# The fast tier (under 3 minutes on 2 cores): no test marked slow.
test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not slow" $(TEST_WORKERS)

# The slow tier alone: real DeepSpeed pipelines, Ray clusters, Tune sweeps.
test-slow: setup-bubbles
	$(VENV)/bin/python -m pytest -q -m slow $(TEST_WORKERS)

clean:
	rm -rf $(VENV) runs configs/runs
