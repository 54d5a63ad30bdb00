# The two promises of the README: `make demo` (set up and run the tiny job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# Keyed by the dependency list, not by file times: a fresh clone reuses a matching venv.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: demo test venv lint clean

venv: $(STAMP)

# torch first (the CPU wheel on disk), then DeepSpeed built against it, then zeropilot itself.
$(STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-build-isolation deepspeed==0.19.8
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: venv
	VENV=$(VENV) scripts/demo.sh

test: venv
	VENV=$(VENV) scripts/test.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf .zeropilot
