"""The bases of dynspec's typed configs, and the one way a validation error is shown.

Every config and file model refuses unknown keys (a typo is an error, not a silent default) and
is frozen once parsed.  StrictModel adds what data read from files needs; Model keeps pydantic's
conversions, for configs built from command-line values.  Every bad input is reported as one
line, `where: key.path: problem`, by validation_message.

Workload holds the defaults of the random-ids workload (prompt and output lengths, prompts per
closed-loop level) that the sweep config, `dynspec sim`, fit specs and calibrate share: each config
takes its defaults from here (field_default), so that every default is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Model(BaseModel):
    """Unknown fields refused; frozen once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StrictModel(Model):
    """Also strict: YAML's true is not 1 and 1e30 is not an integer; no .inf or .nan anywhere."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class Workload(Model):
    """Requests of input_len prompt tokens generating output_len tokens; a closed-loop level of C
    clients measures max(prompts_per_client x C, min_prompts) of them (prompts_at)."""

    input_len: int = Field(1024, ge=1)
    output_len: int = Field(256, ge=1)
    prompts_per_client: int = Field(5, ge=1)
    min_prompts: int = Field(50, ge=1)

    def prompts_at(self, concurrency: int) -> int:
        """Measured requests at a closed-loop level of `concurrency` clients."""
        return max(self.prompts_per_client * concurrency, self.min_prompts)


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default of model's field `name`: what a config or a command-line option takes from the
    model that defines it, instead of repeating the value."""
    field = model.model_fields[name]
    if field.is_required():
        raise KeyError(f"{model.__name__}.{name} has no default")
    return field.get_default(call_default_factory=True)


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


def input_error(prog: str, exc: Exception) -> str:
    """A command's bad input as its one line: `prog: what is wrong` (a pydantic error by its first
    problem and path, anything else by its message)."""
    return f"{prog}: {validation_message(exc) if isinstance(exc, ValidationError) else exc}"
