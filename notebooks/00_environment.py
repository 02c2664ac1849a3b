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
# # 00 · Environment
#
# The machine this run ran on: its GPUs, driver and CUDA, the serving stack's versions
# (torch, sglang, flashinfer), and with GPUs the interconnect topology
# (`nvidia-smi topo -m`). Without a GPU it says so plainly.

# %% tags=["parameters"]
probe_torch = True  # ask torch for its CUDA build (in a subprocess)

# %%
from IPython.display import Markdown, display

from dynspec.environment import collect_environment
from dynspec.analysis.report import environment_tables

env = collect_environment(probe_torch=probe_torch, check_env=probe_torch)
machine, packages, topology = environment_tables(env)

# %% [markdown]
# ## Machine and GPUs

# %%
display(machine)

# %% [markdown]
# ## Serving stack

# %%
display(packages)

# %% [markdown]
# ## Topology

# %%
display(Markdown(f"```\n{topology}\n```"))

# %% [markdown]
# ## `python -m sglang.check_env`
#
# SGLang's own environment record, beside dynspec's above (or why there is none).

# %%
display(Markdown(f"```\n{env['sglang_check_env'] or 'not collected (probe_torch=False)'}\n```"))
