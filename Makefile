# Two commands do all set-up on a fresh machine: `make report` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: report publish test test-tp test-fast lint venv test-venv browser lab clean

# What `make report` needs: dynspec, the notebook stack and a Jupyter kernel for papermill.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[notebooks]'
	$(PY) -m ipykernel install --prefix $(VENV) --name dynspec --display-name 'Python (dynspec)' >/dev/null
	touch $@

# What `make test` adds: the test tools, and the packages the tests import SGLang with on
# CPU (0.5.9 and its sglang.bench_serving; SGLang itself is unpacked from its wheel by the tests).
# torch is its CPU build: scripts/install_cpu_torch.py takes it from PyTorch's CPU index unless
# this machine's indexes already give a CPU build, so no nvidia-* package is ever installed.
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements/sglang-cpu.txt)
$(VENV)/.test-installed: $(VENV)/.installed requirements/sglang-cpu.txt requirements/bench-serving.txt
	$(PIP) install --quiet -e '.[dev,notebooks]'
	$(PY) scripts/install_cpu_torch.py $(TORCH_VERSION)
	$(PIP) install --quiet -r requirements/sglang-cpu.txt
	$(PIP) install --quiet -r requirements/bench-serving.txt
	touch $@

# SGLang 0.5.23 needs transformers 5 (0.5.9: 4.57): its extra packages get their own folder,
# put on PYTHONPATH only by the subprocess of tests/test_patch_0523.py.
SGLANG_0523_DEPS := $(VENV)/sglang-0.5.23-deps
$(SGLANG_0523_DEPS)/.installed: requirements/sglang-0.5.23-cpu.txt | $(VENV)/.test-installed
	rm -rf $(SGLANG_0523_DEPS)
	$(PIP) install --quiet --no-deps --target $(SGLANG_0523_DEPS) -r requirements/sglang-0.5.23-cpu.txt
	touch $@

venv: $(VENV)/.installed
test-venv: $(VENV)/.test-installed $(SGLANG_0523_DEPS)/.installed

# Debian's chromium for the report's browser test: installed with apt when missing and this is
# root; otherwise one line says what to install, and only tests/test_report_browser.py skips.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "make browser: chromium is missing and cannot be installed here (not root): install Debian's chromium (sudo apt-get install chromium) for tests/test_report_browser.py, which skips until then"

# The fast tests on both cores, then the slow ones serially (real SGLang servers start several at
# once and must not share the cores with other tests): CI stays under 30 minutes (22-30 on a fresh clone).
test: test-venv browser lint
	$(PY) -m pytest -m "not slow" -n 2 --dist worksteal
	$(PY) -m pytest -m "slow and not tp" --durations=12

# The patched server at --tp-size 2 on this CPU (five servers, nine scheduler processes: about
# 9 minutes on 2 cores), outside `make test` so that CI stays under 30 minutes.
test-tp: test-venv
	$(PY) -m pytest -m tp

# ruff and mypy (both configured in pyproject.toml): pyflakes, pycodestyle, bugbear; then the
# types of all of src (the simulator's and scheduler's modules also fully annotated).
lint: test-venv
	$(PY) -m ruff check src tests benchmarks experiments scripts notebooks
	$(PY) -m mypy

# Your own loop: everything but the slow tests (real SGLang servers, bench_serving in real time, the
# 0.5.23 wheel import: about 15 minutes of them), on every core (pytest-xdist, work stealing).  CI's
# `make test` runs those slow ones serially: its real-server tests start several SGLang servers at once.
test-fast: test-venv
	$(PY) -m pytest -m "not slow" -n auto --dist worksteal

# The embedded default: the seed's arms and levels, simulated from the seed-blackwell profile.
# `make report` writes into build/ (ignored), so a checkout stays clean; `make publish`
# regenerates the committed report under reports/.
REPORT_CONFIG ?= configs/seed-blackwell.yaml
REPORT_RUN_ID ?= seed-blackwell-sim
report: venv
	$(PY) -m dynspec pipeline --config $(REPORT_CONFIG) --backend sim --run-id $(REPORT_RUN_ID) --overwrite \
		--runs-dir build/runs --reports-dir build/reports

publish: venv
	$(PY) -m dynspec pipeline --config $(REPORT_CONFIG) --backend sim --run-id $(REPORT_RUN_ID) --overwrite

# JupyterLab on notebooks/ from this venv (jupyterlab and jupytext come with the notebooks extra):
# each notebook's jupytext metadata pairs it with its py:percent twin, which a save keeps in step.
# More options through LAB_ARGS, e.g. make lab LAB_ARGS='--no-browser --port 8890'.  As root (a
# container) it needs --allow-root, which it gets.
LAB_ARGS ?=
lab: venv
	$(PY) -m jupyterlab --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
