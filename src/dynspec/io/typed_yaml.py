"""YAML files parsed into pydantic models, once, at the edge: errors name file, key and problem.

Profiles, sweep configs and fit specs all read this way, so a bad file always gets the
same kind of one-line message: `FILE: key.path: problem`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from dynspec.models import validation_message

M = TypeVar("M", bound=BaseModel)


# Bounds far above any real config or profile (a few hundred values, four levels deep) and far
# below what blows up: a 1 KB file of nested aliases expands to billions of values.
MAX_VALUES = 100_000
MAX_DEPTH = 32


def check_bounds(data: object, src: str, error: type[Exception]) -> object:
    """data as parsed, if it expands (aliases followed) to at most MAX_VALUES values nested at
    most MAX_DEPTH deep; else error naming the file.  Each shared node is measured once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    pending: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]

    def kids(obj) -> list:
        return [c for c in (obj.values() if isinstance(obj, dict) else obj) if isinstance(c, (dict, list))]

    while stack:
        obj, finished = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        k = id(obj)
        if finished:
            size[k] = len(obj) + sum(size[id(c)] for c in kids(obj))
            depth[k] = 1 + max((depth[id(c)] for c in kids(obj)), default=0)
            pending.discard(k)
            if size[k] > MAX_VALUES:
                raise error(f"{src}: too large: more than {MAX_VALUES} values once its aliases are expanded")
            if depth[k] > MAX_DEPTH:
                raise error(f"{src}: nested more than {MAX_DEPTH} levels deep")
        elif k in pending:  # met again inside itself
            raise error(f"{src}: an alias refers to the node that contains it")
        elif k not in size:
            pending.add(k)
            stack.append((obj, True))
            stack.extend((c, False) for c in kids(obj))
    return data


def read_yaml(path: Path, error: type[Exception], what: str) -> object:
    """A YAML file's data, bounded (check_bounds); `error` with one line when it is missing,
    unreadable, not UTF-8, not YAML, or too large or deep."""
    from dynspec.io.jsonl import read_text

    try:
        if not path.is_file():
            raise error(f"{path}: no such {what} file")
    except OSError as exc:  # a name too long for the file system, say
        raise error(f"{str(path)[:80]}...: not a usable {what} file name ({exc.strerror})") from None
    return loads_yaml(read_text(path, error), str(path), error)


def loads_yaml(text: str, src: str, error: type[Exception]) -> object:
    """YAML text's data, bounded as read_yaml's."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{src}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    except RecursionError:
        raise error(f"{src}: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a scalar YAML resolves but cannot build, e.g. a date 2024-13-45
        raise error(f"{src}: not valid YAML ({str(exc)[:200]})") from None
    return check_bounds(data, src, error)


def parse_model(model: type[M], data: object, src: str, error: type[Exception], what: str) -> M:
    """Validate `data` as `model`; `error` naming src, key and problem when it is not."""
    if not isinstance(data, dict):
        raise error(f"{src}: a {what} is a YAML mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(validation_message(exc, src)) from None
