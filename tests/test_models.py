"""The shared model bases and the one-line validation message (models.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import Field, ValidationError, model_validator

from dynspec.models import Model, StrictModel, cli_options, input_error, validation_message


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


def test_a_commands_input_error_is_one_line_whatever_raised_it():
    with pytest.raises(ValidationError) as exc:
        Outer(name="x", inner=[{"rate": -1}])
    assert input_error("dynspec sim", exc.value) == "dynspec sim: inner.0.rate: Input should be greater than 0"
    assert input_error("dynspec sim", ValueError("no such profile")) == "dynspec sim: no such profile"


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


def _cli_defaults(add_cli, command: str, *required: str) -> dict:
    """The defaults of one dynspec command's options, as its parser fills them in."""
    import argparse

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    return vars(parser.parse_args([command, *required]))


def test_the_workload_defaults_are_the_same_everywhere():
    import inspect

    from dynspec.calibrate import run as calibrate
    from dynspec.sim import fit
    from dynspec.sim import run as sim
    from dynspec.live.config import SweepConfig
    from dynspec.models import Workload, field_default

    w = Workload()
    assert (w.input_len, w.output_len, w.prompts_per_client, w.min_prompts) == (1024, 256, 5, 50)  # as the docs say
    for name in Workload.model_fields:
        assert field_default(SweepConfig, name) == getattr(w, name), name
    lengths = {"input_len": w.input_len, "output_len": w.output_len}
    for model in (sim.SimConfig, fit.Workload):
        assert {n: field_default(model, n) for n in lengths} == lengths, model.__name__
    assert fit.FitSpec.model_fields["workload"].default == fit.Workload()
    for func in (sim.simulate_level, sim.run_sim):
        params = inspect.signature(func).parameters
        assert {n: params[n].default for n in lengths} == lengths, func.__name__
    args = _cli_defaults(sim.add_cli, "sim", "--profile", "p", "--concurrency", "1", "--out", "o.csv")
    assert {n: args[n] for n in lengths} == lengths
    assert field_default(calibrate.CalibrateConfig, "input_len") == w.input_len
    assert _cli_defaults(calibrate.add_cli, "calibrate", "--name", "n", "--out", "o.yaml")["input_len"] == w.input_len


def test_the_prompts_of_a_closed_loop_level():
    from dynspec.live.config import SweepConfig
    from dynspec.models import Workload
    from dynspec.sim.run import default_num_prompts

    levels = (1, 10, 11, 128)
    assert [Workload().prompts_at(c) for c in levels] == [50, 50, 55, 640]  # max(5C, 50)
    assert [default_num_prompts(c) for c in levels] == [50, 50, 55, 640]
    assert [Workload(prompts_per_client=2, min_prompts=12).prompts_at(c) for c in (1, 6, 7)] == [12, 12, 14]
    cfg = SweepConfig(name="w", concurrency=[1, 7], prompts_per_client=2, min_prompts=12,
                      arms=[{"name": "a", "launch": "serve", "sim_arm": "baseline"}])
    assert cfg.workload == Workload(prompts_per_client=2, min_prompts=12)
    assert [cfg.prompts_for(c) for c in (1, 7)] == [12, 14]


def test_the_simulator_arms_are_defined_once():
    from dynspec.live import arm as config
    from dynspec.sim import run as sim

    assert config.SIM_ARMS is sim.SIM_ARMS == tuple(sim.ARM_POLICIES)


def test_field_default_refuses_a_required_field():
    from dynspec.models import field_default

    assert field_default(Options, "num_steps") == 1
    with pytest.raises(KeyError, match="Outer.name has no default"):
        field_default(Outer, "name")
