# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Both create .venv once; torch is installed first so pip takes the local CPU build
# (torch==2.13.0) instead of pulling a multi-GB CUDA build through an open range.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e '.[test]'
	touch $@

.PHONY: setup run test
setup: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/roofline profile --quick --overwrite --out roofline-out

# Two workers: the suite is CPU-bound and the reference box has two cores.
test: $(VENV)/.installed
	$(PY) -m pytest -n 2
