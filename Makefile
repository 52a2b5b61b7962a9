# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Both create .venv once; torch is installed first (TORCH, from TORCH_INDEX: below) so the
# package's open torch range does not pull another build.
VENV ?= .venv
# Which torch: TORCH_INDEX is an extra package index for it. Default: the CPU-wheel index when this machine
# has no nvidia-smi and can reach it (a CPU box gets torch's CPU build, ~200 MB, not the multi-GB CUDA build),
# none otherwise
# (PyPI's default build, CUDA on Linux). Override: make run TORCH_INDEX=https://download.pytorch.org/whl/cu126
# or TORCH_INDEX= (PyPI only); TORCH picks the version.
TORCH ?= torch==2.13.0
# The CPU index is used only when it answers (a machine that reaches only a package mirror keeps its own torch);
# ?= is evaluated lazily: only when the venv is built.
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(shell python3 -c "import urllib.request as u; u.urlopen('$(CPU_INDEX)/', timeout=5); print('$(CPU_INDEX)')" 2>/dev/null))
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# pip's own lines are kept out of the terminal (they go to $(VENV)/install.log); each step says what it does.
LOG := $(VENV)/install.log

# What running needs (torch, then this package and its runtime dependencies): `make run` stops here.
$(VENV)/.installed: pyproject.toml
	@echo "make: creating $(VENV) (once; delete it to start again)"
	@python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || { echo "make: installing $(TORCH)$(if $(TORCH_INDEX), from $(TORCH_INDEX),) ..."; \
	  $(PIP) install --progress-bar off $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)" >>$(LOG) 2>&1 || { tail -20 $(LOG); exit 1; }; }
	@echo "make: installing roofline and its runtime dependencies (matplotlib, triton, click, rich, ...) ..."
	@$(PIP) install --progress-bar off -e . >>$(LOG) 2>&1 || { tail -20 $(LOG); exit 1; }
	@touch $@

# The test extras (pytest, hypothesis, transformers, nbclient, ...) come with `make test` only.
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	@echo "make: installing the test extras (pytest, hypothesis, transformers, safetensors, nbclient, ipykernel) ..."
	@$(PIP) install --progress-bar off -e '.[test]' >>$(LOG) 2>&1 || { tail -20 $(LOG); exit 1; }
	@touch $@

.PHONY: setup run test
setup: $(VENV)/.installed-test

run: $(VENV)/.installed
	@echo "make: a quick profile sweep of this machine (a minute or two on a CPU), then its report in roofline-out/"
	$(VENV)/bin/roofline profile --quick --overwrite --out roofline-out

# Two workers: the suite is CPU-bound and the reference box has two cores.
test: $(VENV)/.installed-test
	$(PY) -m pytest -n 2
