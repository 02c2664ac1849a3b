"""The step-cost profile format: load, validate, interpolate."""

from __future__ import annotations

import pytest
import yaml

from dynspec.sim.profile import ProfileError, load_profile, parse_profile, shipped_profiles
from tests.test_policy import profile_dict


def write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_interpolation_and_extrapolation_flag(tmp_path):
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 8, 64], "plain_ms": [10, 12, 40], "spec_ms": [15, 20, 90]}
    p = load_profile(write(tmp_path, d))
    assert p.plain_time(1) == pytest.approx(0.010)
    assert p.plain_time(4.5) == pytest.approx(0.011)  # halfway between 1 and 8
    assert p.spec_time(36) == pytest.approx(0.055)
    assert p.plain_time(128) == pytest.approx((40 + 28 / 56 * 64) / 1000)  # last segment extended
    assert p.extrapolates(128) and not p.extrapolates(64)
    assert p.acceptance.mean_accepted == pytest.approx(1.5)


def test_spec_time_from_parts(tmp_path):
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "draft_ms": [3, 6],
                  "verify_ms": [11, 30], "extend_ms": [2, 4]}
    p = load_profile(write(tmp_path, d))
    assert p.spec_time(1) == pytest.approx(0.016)
    assert p.spec_time(64) == pytest.approx(0.040)


def _bad(**changes):
    d = profile_dict()
    for dotted, value in changes.items():
        node = d
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node[k]
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return d


BAD = [
    (_bad(steps__batch_size=[1, 1]), "strictly increasing"),
    (_bad(steps__plain_ms=[10]), "plain_ms has 1 values but batch_size has 2"),
    (_bad(steps__plain_ms=[10, -1]), "plain_ms must hold positive times"),
    (_bad(steps__spec_ms=KeyError), "give spec_ms, or all of draft_ms"),
    (_bad(acceptance__accept_length=0.5), "acceptance.accept_length"),
    (_bad(acceptance__accept_length=5.0), "exceeds 1 + speculative.num_steps = 4"),
    (_bad(acceptance=KeyError), "acceptance: Field required"),
    (_bad(provenance__kind="guessed"), "provenance.kind"),
    (_bad(colour="blue"), "colour: unknown key"),
    (_bad(steps__batch_size=[0, 5]), "batch_size must be positive"),
    # non-finite times, acceptance the engine cannot reach, booleans as numbers
    (_bad(steps__plain_ms=[10, float("inf")]), "finite number"),
    (_bad(steps__spec_ms=[float("nan"), 20]), "finite number"),
    (_bad(acceptance__accept_length=float("inf")), "finite number"),
    (_bad(acceptance__accept_length=4.0), "out of reach with 3 draft steps"),
    (_bad(speculative__topk=True), "speculative.topk: Input should be a valid integer"),
]


@pytest.mark.parametrize("data,message", BAD)
def test_bad_profiles_name_file_key_and_problem(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    text = str(info.value)
    assert text.startswith(str(path) + ": ")
    assert message in text
    assert "\n" not in text


def test_not_yaml_not_a_mapping_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ProfileError, match="a profile is a YAML mapping, got list"):
        load_profile(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "missing.yaml")
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile("definitely-not-shipped")


def test_parse_profile_is_frozen():
    p = parse_profile(profile_dict())
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        p.name = "other"


@pytest.mark.parametrize("name", shipped_profiles())
def test_shipped_profiles_load(name):
    p = load_profile(name)
    assert p.name == name
    assert p.provenance.source
    for bs in (1, 8, 64, 128):
        assert p.plain_time(bs) > 0 and p.spec_time(bs) > 0


def _tables(*specs):
    return [{"context_len": c, "batch_size": [1, 64], "plain_ms": list(p), "spec_ms": list(s)} for c, p, s in specs]


def test_several_context_tables_interpolate_linearly_in_the_context(tmp_path):
    d = profile_dict()
    d["steps"] = _tables((1024, (10, 20), (15, 40)), (4096, (16, 50), (20, 70)))
    p = load_profile(write(tmp_path, d))
    assert p.context_aware and [t.context_len for t in p.steps] == [1024, 4096]
    assert p.plain_time(1) == pytest.approx(0.010)  # no context: the first table
    assert p.plain_time(1, 1024) == pytest.approx(0.010) and p.plain_time(1, 4096) == pytest.approx(0.016)
    assert p.plain_time(1, 2560) == pytest.approx(0.013)  # halfway
    assert p.spec_time(64, 2560) == pytest.approx(0.055)
    assert p.plain_time(64, 7168) == pytest.approx(0.080)  # beyond: the same line extended
    assert p.extrapolates(8, 7168) and p.extrapolates(8, 512) and not p.extrapolates(8, 2000)
    assert p.extrapolates(128, 2000) and not p.extrapolates(8)


@pytest.mark.parametrize("steps,message", [
    (_tables((1024, (10, 20), (15, 40)), (1024, (16, 50), (20, 70))), "context_len, strictly increasing"),
    ([{"batch_size": [1, 64], "plain_ms": [1, 2], "spec_ms": [2, 3]}] * 2, "several tables need each a context_len"),
    ([], "steps: List should have at least 1 item"),
    ({"batch_size": [1, 64], "plain_ms": [1, 2], "spec_ms": [2, 3], "forward_ms": {2: [1.0]}},
     "forward_ms[2] must hold 2 positive times"),
])
def test_bad_context_tables_are_refused(tmp_path, steps, message):
    d = profile_dict()
    d["steps"] = steps
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile(write(tmp_path, d))


def test_crossover_batch_is_where_accept_length_plain_steps_cost_a_speculative_one():
    # spec/plain rises from 1.2 at batch 1 to 3.0 at batch 64 (linear in each time)
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [12, 60]}
    p = parse_profile(d)
    for al in (1.5, 2.0, 2.5):
        b = p.crossover_batch(al)
        assert al * p.plain_time(b) <= p.spec_time(b) and al * p.plain_time(b - 1) > p.spec_time(b - 1)
    assert p.crossover_batch(1.1) == 1  # never pays
    assert p.crossover_batch(3.5) is None  # pays at every measured batch size
    assert p.crossover_batch() == p.crossover_batch(p.acceptance.accept_length)
    assert p.crossover_batch(3.5, up_to=1000) > 64  # found on the extended last segment


def test_spec_ms_goes_with_extend_ms_alone():
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [15, 40], "extend_ms": [1, 3]}
    p = parse_profile(d)
    assert p.spec_time(1) == pytest.approx(0.015)  # extend is inside spec_ms, not added to it
    assert p.catch_up_time(64) == pytest.approx(0.003)
    d["steps"]["verify_ms"] = [11, 30]
    with pytest.raises(ProfileError, match="give spec_ms or its parts, not both"):
        parse_profile(d)


def test_a_kv_only_catch_up_replaces_the_extend_and_a_switch_pays_a_resume():
    """catchup_ms, when given, is a switching server's plain-step overhead (not extend_ms, which
    stays part of the speculative step); resume_ms is per plain-to-spec switch.  Without them a
    profile keeps its meaning: extend_ms is the catch-up and a switch costs nothing."""
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "draft_ms": [3, 6], "verify_ms": [11, 30],
                  "extend_ms": [2, 4], "catchup_ms": [0.2, 0.6], "resume_ms": [0.5, 1.5], "extend_eager_ms": [5, 9]}
    p = parse_profile(d)
    assert p.catch_up_time(1) == pytest.approx(0.0002) and p.catch_up_time(32.5) == pytest.approx(0.0004)
    assert p.resume_time(64) == pytest.approx(0.0015)
    assert p.spec_time(1) == pytest.approx(0.016)  # extend still in the speculative step
    old = {k: v for k, v in d["steps"].items() if k not in ("catchup_ms", "resume_ms")}
    p_old = parse_profile({**d, "steps": old})
    assert p_old.catch_up_time(64) == pytest.approx(0.004) and p_old.resume_time(64) == 0.0
    tables = [{**d["steps"], "context_len": 1024},
              {**d["steps"], "context_len": 4096, "catchup_ms": [0.4, 1.0], "resume_ms": [1.5, 2.5]}]
    p2 = parse_profile({**d, "steps": tables})
    assert p2.catch_up_time(1, 2560) == pytest.approx(0.0003) and p2.resume_time(64, 2560) == pytest.approx(0.002)


@pytest.mark.parametrize("change,message", [
    ({"resume_ms": None}, "give catchup_ms and resume_ms together"),
    ({"catchup_ms": None}, "give catchup_ms and resume_ms together"),
    ({"catchup_ms": [0.1]}, "catchup_ms has 1 values but batch_size has 2"),
    ({"resume_ms": [0.1, -1]}, "resume_ms must hold positive times"),
])
def test_bad_catch_up_columns_are_refused(change, message):
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [15, 40], "catchup_ms": [0.1, 0.2],
                  "resume_ms": [0.5, 1.0], **change}
    d["steps"] = {k: v for k, v in d["steps"].items() if v is not None}
    with pytest.raises(ProfileError, match=message):
        parse_profile(d)
    d["steps"] = [{"context_len": 1024, "batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [15, 40],
                   "catchup_ms": [0.1, 0.2], "resume_ms": [0.5, 1.0]},
                  {"context_len": 4096, "batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [15, 40]}]
    with pytest.raises(ProfileError, match="in every table or in none"):
        parse_profile(d)


def test_a_valid_profile_never_fails_in_the_engine():
    """What validation accepts, the engine can run: accept lengths up to the reachable edge."""
    from dynspec.sim.engine import Engine

    for al in (1.01, 2.0, 3.0, 3.5, 3.9, 3.99, 4.0):
        try:
            prof = parse_profile(_bad(acceptance__accept_length=al))
        except ProfileError:
            continue
        Engine(prof, policy=None)
