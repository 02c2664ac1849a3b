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
# # 01 · The dynamic-disable patch
#
# dynspec switches speculation off at run time through a small patch to SGLang's
# spec v2 worker (`patches/`). This notebook shows the patch's status in the SGLang
# installation it finds and, only when asked (`apply=True`), applies it, or with
# `dry_run=True` shows what applying would change. On a machine without SGLang it
# reports that and changes nothing.

# %% tags=["parameters"]
apply = False  # apply the patch (with dry_run, only show what would change)
dry_run = True  # with apply: change nothing, list what applying would do
sglang_path = None  # the site-packages (or sglang package) dir to patch; None: the installed sglang

# %%
from IPython.display import Markdown, display

from dynspec.sglang import patching
from dynspec.analysis.report import patch_table

try:
    target = patching.find_sglang(sglang_path)
except patching.Refusal as exc:
    target = None
    display(Markdown(f"**Status:** no SGLang to patch here ({exc}). Nothing was changed."))
if target is not None:
    st = patching.status(target)
    display(Markdown(f"**Status:** `{st.line()}`"))
    if st.patchset is not None:
        display(Markdown(f"What the patch series for SGLang {st.patchset.version} changes:"))
        display(patch_table(st.patchset))

# %% [markdown]
# ## Apply

# %%
if target is None:
    display(Markdown("No SGLang: nothing applied, nothing changed."))
elif not apply:
    display(Markdown("`apply=False`: nothing applied, nothing changed."))
else:
    outcome = patching.do_apply(target, dry_run=dry_run)
    display(Markdown(f"**{'Dry run' if dry_run else 'Applied'}:** {outcome.message}"))
    display(Markdown(f"**Status now:** `{patching.status(target).line()}`"))
