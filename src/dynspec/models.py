"""The bases of dynspec's typed configs, and the one way a validation error is shown.

Every config and file model refuses unknown keys (a typo is an error, not a silent default) and
is frozen once parsed.  StrictModel adds what data read from files needs; Model keeps pydantic's
conversions, for configs built from command-line values.  Every bad input is reported as one
line, `where: key.path: problem`, by validation_message.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, ValidationError


class Model(BaseModel):
    """Unknown fields refused; frozen once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StrictModel(Model):
    """Also strict: YAML's true is not 1 and 1e30 is not an integer; no .inf or .nan anywhere."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


def cli_options(model: type[BaseModel], **renamed: str) -> dict[str, str]:
    """Each field of model as its command-line option (num_steps: --num-steps), or as renamed."""
    return {name: renamed.get(name, "--" + name.replace("_", "-")) for name in model.model_fields}


def validation_message(exc: ValidationError, where: str = "", options: Mapping[str, str] | None = None) -> str:
    """The first error of exc as one line: `where: key.path: problem (and N more)`, without
    `where` when none is given and without the path when the whole input is at fault.
    options: how the user writes a top-level field (cli_options), where that is not its name."""
    err = exc.errors()[0]
    path = [str(p) for p in err["loc"]]
    if path and options:
        path[0] = options.get(path[0], path[0])
    problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return ": ".join(part for part in (where, ".".join(path), problem) if part) + more
