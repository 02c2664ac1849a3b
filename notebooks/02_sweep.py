# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Sweep
#
# Every arm of the config at every concurrency level, on one backend: `sim` (the
# in-process simulator, virtual time, the default), `emulate` (the same engine behind
# SGLang's HTTP API, real time) or `live` (SGLang servers on this node's GPUs). Rows
# land in `data/runs/<run-id>/results.csv` as they are measured.

# %% tags=["parameters"]
# Relative paths are taken from the repository root, wherever the notebook runs.
config = "configs/ci-tiny.yaml"  # a sweep config (YAML)
backend = "sim"  # sim | emulate | live
run_id = None  # None: a new id from the config name and the time
runs_dir = "data/runs"
resume = False  # continue run_id, skipping levels already measured

# %%
from concurrent.futures import ThreadPoolExecutor

from IPython.display import Markdown, display

from dynspec.live.config import load_config
from dynspec.paths import from_repo
from dynspec.analysis.report import level_table, load_run
from dynspec.live.sweep import run_sweep

config, runs_dir = from_repo(config), from_repo(runs_dir)
cfg = load_config(config)
# The kernel already runs an asyncio loop and the sweep's HTTP clients start their own,
# so the sweep runs in a worker thread (the same code `dynspec sweep` runs).
with ThreadPoolExecutor(1) as pool:
    result = pool.submit(run_sweep, cfg, backend=backend, run_id=run_id, resume=resume, runs_dir=runs_dir,
                         progress=False, config_path=config).result()
verdict = "some levels failed: see the error column and sweep.log" if result.failed else "complete"
display(Markdown(f"Run folder: `{result.run_dir}` · {result.rows} rows · {verdict}"))

# %% [markdown]
# ## Output throughput (tok/s) by arm and concurrency

# %%
levels = level_table(load_run(result.run_dir).results)
display(levels.pivot_table(index="concurrency", columns="arm", values="output_throughput").round(1))
