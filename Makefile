# Set-up and the two quick-start commands. `make demo` and `make test` each build the
# virtualenv first when pyproject.toml is newer than it.
PYTHON ?= python3
# The CPU build: a plain `pip install torch` would fetch the multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench clean chromium

# --no-compile: pip would byte-compile every module of every package (torch's, ray's, ...): 201 s of set-up against
# 113 s without, on 2 cores; Python compiles the modules a run imports the first time it imports them (~5 s, once).
PIP := $(BIN)/pip install -q --disable-pip-version-check --no-compile

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufill demo --fresh --yes
	$(BIN)/gpufill results --workdir gpufill-demo --best
	@echo "next: source $(VENV)/bin/activate   (puts gpufill on your PATH; then: gpufill report --workdir gpufill-demo)"

# Headless Chromium for the report test (Debian's package; CI runs as root).
chromium:
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# The whole suite, what CI runs, in two passes: the tests that measure time (marker `serial`) alone, after the rest two
# at a time (pytest-xdist; worksteal: an idle worker takes queued tests from a busy one, no tail behind a heavy file).
PYTEST := $(BIN)/python -m pytest -q
test: $(STAMP) chromium
	$(PYTEST) -n 2 --dist worksteal -m "not serial" --durations=20; rest=$$?; \
	$(PYTEST) -m serial --durations=20; timed=$$?; \
	test $$rest -eq 0 && test $$timed -eq 0

# The loop to run while working: every test not marked `slow` (no whole campaign, server or interpreter of its own).
# Exit status 5 is "no test selected", which a pass may be.
test-fast: $(STAMP)
	$(PYTEST) -n 2 --dist worksteal -m "not slow and not serial"; rest=$$?; \
	$(PYTEST) -m "serial and not slow"; timed=$$?; \
	test $$rest -eq 0 && { test $$timed -eq 0 || test $$timed -eq 5; }

bench: $(STAMP)
	$(BIN)/python bench/fit_speed.py

clean:
	rm -rf $(VENV) gpufill-demo .pytest_cache
