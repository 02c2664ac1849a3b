"""One arm of a sweep: the server it measures (a launch line and its environment, or another
arm's server it shares) and the policy it runs, stated once in sim_arm."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dynspec.models import StrictModel
from dynspec.roles import ARM_POLICIES, SIM_ARMS
from dynspec.sglang.policy_control import ENV_POLICY_CONTROL


def _stated_policy(sim_arm: str) -> str | None:
    """The policy spec sim_arm names (None: no speculation); as written, not yet checked."""
    return ARM_POLICIES.get(sim_arm) if sim_arm in ARM_POLICIES else sim_arm.removeprefix("policy:")


class Arm(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)  # used in file names
    description: str = ""
    sim_arm: str = "baseline"
    launch: list[str] = []  # argv of the live server, with {model} {draft_model} {port} {host}
    env: dict[str, str] = {}
    api: Literal["generate", "openai", "chat"] = "generate"
    driver: Literal["bench_serving", "dynspec"] | None = None  # the client; None: the config's
    # Live: measured on that arm's (patched) server, its policy written into the server's
    # DYNSPEC_POLICY_CONTROL file before each of its levels.  Two processes of one build measure
    # several percent apart, so policies compared on one process differ only by their choices.
    shares: str | None = None

    @field_validator("launch", mode="before")
    @classmethod
    def _split(cls, v):
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("sim_arm")
    @classmethod
    def _sim_arm(cls, v: str) -> str:
        if v in SIM_ARMS:
            return v
        if v.startswith("policy:"):
            from dynspec.policy import PolicySpecError, check_spec
            from dynspec.sim.profile import load_profile

            try:
                return "policy:" + check_spec(v.removeprefix("policy:"), load_profile=load_profile)
            except PolicySpecError as exc:
                raise ValueError(str(exc)) from None
        raise ValueError(f"{v!r} is not one of {', '.join(SIM_ARMS)} or policy:SPEC")

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v):
        # YAML turns 1 and true into numbers and booleans; the environment wants strings.
        # Only scalars are turned into strings: a list or mapping (an alias, say) is left for the type check.
        if isinstance(v, dict):
            return {str(k): "1" if x is True else "0" if x is False else str(x) if isinstance(x, (int, float)) else x
                    for k, x in v.items()}
        return v

    @model_validator(mode="before")
    @classmethod
    def _derive_policy_env(cls, data):
        # sim_arm states a switching arm's policy; a patched server reads it from DYNSPEC_POLICY.
        if isinstance(data, dict) and isinstance(data.get("sim_arm"), str):
            stated = _stated_policy(data["sim_arm"])
            env = data.get("env") or {}
            if stated is not None and data["sim_arm"] != "eagle3" and isinstance(env, dict) \
                    and "DYNSPEC_POLICY" not in env:
                data = {**data, "env": {**env, "DYNSPEC_POLICY": stated}}
        return data

    @model_validator(mode="after")
    def _one_policy(self) -> "Arm":
        """An env DYNSPEC_POLICY is checked as `dynspec policy check` does and must be the policy
        sim_arm states: otherwise a typo makes a patched server fall back to speculating on every
        step while the results say it switched."""
        env = self.env.get("DYNSPEC_POLICY")
        if env is None:
            return self
        from dynspec.policy import PolicySpecError, check_spec
        from dynspec.sim.profile import load_profile

        try:
            told = check_spec(env, load_profile=load_profile)
        except PolicySpecError as exc:
            raise ValueError(f"arm {self.name!r}: env DYNSPEC_POLICY: {exc}") from None
        stated = _stated_policy(self.sim_arm)
        if stated is None or check_spec(stated, load_profile=load_profile) != told:
            raise ValueError(f"arm {self.name!r}: sim_arm {self.sim_arm!r} runs {stated or 'no speculation'} "
                             f"but env DYNSPEC_POLICY is {env!r}; state the policy once, in sim_arm")
        return self

    @property
    def speculates(self) -> bool:
        """Whether the live server needs a draft model."""
        return "{draft_model}" in " ".join(self.launch)


def sharing_problem(arms: list[Arm], schedule: str) -> str:
    """Why an arm's `shares` cannot be served ("" when every one can)."""
    by_name = {a.name: a for a in arms}
    for a in arms:
        if a.shares is None:
            continue
        host, where = by_name.get(a.shares), f"arm {a.name!r}: shares {a.shares!r}"
        if host is None or host is a:
            return f"{where}: name another arm of this config"
        if host.shares is not None:
            return f"{where}: that arm shares {host.shares!r}; name the arm whose server it is"
        if a.launch or set(a.env) - {"DYNSPEC_POLICY"}:
            return f"{where}: it runs on that arm's server; leave out its launch and env"
        if "DYNSPEC_POLICY" not in a.env:
            return f"{where}: sim_arm {a.sim_arm!r} states no policy for a patched server"
        if "DYNSPEC_POLICY" not in host.env or ENV_POLICY_CONTROL in host.env:
            return (f"{where}: that arm must be a patched server (DYNSPEC_POLICY) without "
                    f"{ENV_POLICY_CONTROL}, which the sweep sets")
        if schedule != "interleaved":
            return f"{where}: sharing a server needs schedule: interleaved"
    return ""
