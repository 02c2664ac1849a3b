"""The shared model bases and the one-line validation message (models.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import Field, ValidationError, model_validator

from dynspec.models import Model, StrictModel, cli_options, validation_message


class Inner(StrictModel):
    rate: float = Field(gt=0)


class Outer(StrictModel):
    name: str
    inner: list[Inner] = []


class Options(Model):
    num_steps: int = Field(1, ge=1)
    contexts: tuple[int, ...] = ()


def error_of(model, **data) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        model(**data)
    return e.value


def message(model, **data) -> str:
    return validation_message(error_of(model, **data))


@pytest.mark.parametrize("model", [Outer, Options])
def test_an_unknown_field_is_refused_in_one_line_naming_it(model):
    data = {"name": "x"} if model is Outer else {}
    assert message(model, **data, colour="blue") == "colour: unknown key"


@pytest.mark.parametrize("model", [Outer(name="x"), Options()])
def test_a_built_model_cannot_be_changed(model):
    field = next(iter(type(model).model_fields))
    with pytest.raises(ValidationError, match="frozen"):
        setattr(model, field, getattr(model, field))


def test_a_nested_error_is_one_line_naming_its_location_and_counting_the_rest():
    msg = validation_message(error_of(Outer, name="x", inner=[{"rate": 1.0}, {"rate": 0.0}, {"rate": -1.0}]),
                             "cfg.yaml")
    assert msg == "cfg.yaml: inner.1.rate: Input should be greater than 0 (and 1 more)"
    assert "\n" not in msg


def test_a_problem_of_the_whole_input_has_no_location():
    class Pair(Model):
        low: int
        high: int

        @model_validator(mode="after")
        def _ordered(self) -> Pair:
            if self.low > self.high:
                raise ValueError("low must not exceed high")
            return self

    assert validation_message(error_of(Pair, low=2, high=1), "pair") == "pair: low must not exceed high"


def test_strict_refuses_what_the_lenient_base_converts():
    assert message(Inner, rate=float("inf")) == "rate: Input should be a finite number"
    assert message(Inner, rate=True) == "rate: Input should be a valid number"
    assert Options(num_steps="3").num_steps == 3


def test_options_name_fields_as_the_command_line_writes_them():
    options = cli_options(Options, contexts="--context")
    assert options == {"num_steps": "--num-steps", "contexts": "--context"}
    msg = validation_message(error_of(Options, num_steps=0), options=options)
    assert msg == "--num-steps: Input should be greater than or equal to 1"


def test_models_imports_no_numeric_library():
    code = "import sys, dynspec.models; sys.exit(any(m in sys.modules for m in ('numpy', 'pandas', 'torch')))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
