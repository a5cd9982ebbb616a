# Set-up and the two quick-start commands. `make demo` and `make test` each build the
# virtualenv first when pyproject.toml is newer than it.
PYTHON ?= python3
# The CPU build: a plain `pip install torch` would fetch the multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufill demo --fresh --yes
	$(BIN)/gpufill results --workdir gpufill-demo --summary

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/fit_speed.py

clean:
	rm -rf $(VENV) gpufill-demo .pytest_cache
