"""YAML files parsed into pydantic models, once, at the edge: errors name file, key and problem.

Profiles, sweep configs and fit specs all read this way, so a bad file always gets the
same kind of one-line message: `FILE: key.path: problem`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def validation_message(src: str, exc: ValidationError) -> str:
    """The first validation error as one line: `src: key.path: problem (and N more)`."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{src}: {loc}: {msg}{more}"


def read_yaml(path: Path, error: type[Exception], what: str) -> object:
    """A YAML file's data; `error` with one line when it is missing or not YAML."""
    if not path.is_file():
        raise error(f"{path}: no such {what} file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None


def parse_model(model: type[M], data: object, src: str, error: type[Exception], what: str) -> M:
    """Validate `data` as `model`; `error` naming src, key and problem when it is not."""
    if not isinstance(data, dict):
        raise error(f"{src}: a {what} is a YAML mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(validation_message(src, exc)) from None
