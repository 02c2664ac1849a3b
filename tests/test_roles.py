"""dynspec.roles: one rule for which arm is plain, always-speculating or switching."""

from __future__ import annotations

import pandas as pd

from dynspec import roles


def test_the_policy_decides_and_the_name_only_without_one():
    assert roles.role("anything", ["none"]) == "plain" and roles.role("x", ["never", "never"]) == "plain"
    assert roles.role("baseline", ["always"]) == "spec"  # the policy column wins over the name
    assert roles.role("eagle3", ["goodput"]) == "switching"
    assert roles.role("eagle3", ["always", "goodput"]) == "switching"  # mixed rows: it switched
    assert roles.role("Baseline", ["", float("nan")]) == "plain" and roles.role("EAGLE3", []) == "spec"
    assert roles.role("dynamic", []) is None


def test_report_and_tune_agree_on_the_roles():
    from dynspec.analysis import report
    from dynspec.analysis import tune

    df = pd.DataFrame({"arm": ["plain-srv", "spec-srv", "dyn"], "policy": ["never", "always", "goodput"],
                       "concurrency": [1, 1, 1]})
    assert roles.arms_by_role(df) == {"dyn": "switching", "plain-srv": "plain", "spec-srv": "spec"}
    assert report.static_arms(df) == (["plain-srv"], ["spec-srv"])
    assert tune._pick_arm(df, None, "plain", "no-speculation", "--baseline-arm") == "plain-srv"
    assert tune._pick_arm(df, None, "spec", "always-speculate", "--spec-arm") == "spec-srv"
