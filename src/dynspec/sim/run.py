"""Closed-loop clients over the step engine in virtual time -> results rows.

The clients behave as `sglang.bench_serving --max-concurrency C` with a fixed
random-ids workload: num_prompts requests of input_len prompt tokens and
output_len generated tokens (ignore_eos), at most C in flight, the next sent the
moment one completes.  Metrics follow bench_serving's definitions (results.summarize).

Arms: baseline (a server without speculation), eagle3 (speculate every step),
dynamic (dynspec's goodput policy, built *without* the profile, so that it learns
step times from the engine's StepRecords as it would on a real server), and
policy:SPEC for any policy spec.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from pydantic import Field, field_validator

from dynspec.io.atomic import write_json
from dynspec.sim.engine import Engine
from dynspec.roles import ARM_POLICIES, SIM_ARMS
from dynspec.models import Model, Workload, field_default, input_error
from dynspec.policy import PolicySpecError, build_policy
from dynspec.sim.profile import load_profile
from dynspec.results import DEFAULT_PERCENTILES, RequestRecord, make_row, summarize

# The workload's defaults, written once in Workload (models.py).
DEFAULT_WORKLOAD = Workload()


def arm_policy_spec(arm: str) -> str | None:
    """The policy spec an arm runs (None: no speculation at all); ValueError names a bad arm."""
    if not isinstance(arm, str):
        raise ValueError(f"arm must be a string, got {type(arm).__name__}")
    if arm in ARM_POLICIES:
        return ARM_POLICIES[arm]
    if arm.startswith("policy:"):
        spec = arm[len("policy:"):].strip()
        try:
            build_policy(spec, load_profile=load_profile)
        except PolicySpecError as exc:
            raise ValueError(f"arm {arm!r}: {exc}") from None
        return spec
    raise ValueError(f"unknown arm {arm!r} (known: {', '.join(SIM_ARMS)}, or policy:SPEC)")


def default_num_prompts(concurrency: int) -> int:
    """Requests per closed-loop level when none are given: max(5*C, 50) (Workload.prompts_at)."""
    return DEFAULT_WORKLOAD.prompts_at(concurrency)


def _check_level(concurrency: int, num_prompts: int, input_len: int, output_len: int) -> None:
    for name, v in (("concurrency", concurrency), ("num_prompts", num_prompts),
                    ("input_len", input_len), ("output_len", output_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


def simulate_level(profile, arm: str, concurrency: int, *, num_prompts: int | None = None,
                   input_len: int = DEFAULT_WORKLOAD.input_len, output_len: int = DEFAULT_WORKLOAD.output_len,
                   seed: int = 0, engine_out: list | None = None, catch_up: bool = True, request_rate: float = math.inf,
                   burstiness: float = 1.0, lengths: list[tuple[int, int]] | None = None,
                   percentiles=DEFAULT_PERCENTILES, slo: dict | None = None,
                   on_step=None, caps: list[int] | None = None,
                   candidate_steps: list[int] | None = None) -> tuple[dict, list[RequestRecord]]:
    """Run one (arm, level); return the metric columns and per-request records.

    Closed loop (request_rate inf): at most `concurrency` requests in flight, the next sent when
    one completes.  Open loop: requests arrive at request_rate per second (dynspec.sim.arrivals, gamma
    intervals of shape burstiness, seeded), at most `concurrency` in flight when it is >= 1 (0: no
    cap); a request held back by the cap starts its clock when it is sent, as bench_serving's.
    lengths: (input, output) tokens per request, instead of input_len/output_len for all.
    caps: closed loop only, request i sent once fewer than caps[i] are in flight (a load that moves).
    engine_out, when given, receives the engine (for its counters and extrapolation flags).
    catch_up=False: a switching arm's plain steps cost no more than the plain server's (a what-if).
    on_step(engine, step), when given, is called after every engine step (experiments/generated-machines/trace_level.py).
    candidate_steps: the draft lengths the server can run (SGLang 0.5.23's candidate steps); the arm's
    policy then picks one per step (Policy.decide_steps).  None: on/off at the profile's num_steps.
    """
    from dynspec.sim.arrivals import arrival_times

    spec = arm_policy_spec(arm)
    closed = math.isinf(request_rate)
    n = (default_num_prompts(concurrency) if num_prompts is None else num_prompts) if lengths is None else len(lengths)
    _check_level(concurrency if closed else max(concurrency, 1), n, input_len, output_len)
    if caps is not None and (not closed or len(caps) != n or min(caps) < 1):
        raise ValueError("caps: one cap of at least 1 per request, closed loop only")
    sizes = lengths or [(input_len, output_len)] * n
    engine = Engine(profile, build_policy(spec, load_profile=load_profile) if spec else None, seed=seed, record_itl=True, catch_up=catch_up,
                    candidate_steps=candidate_steps)
    cap = concurrency if closed or concurrency >= 1 else n
    arrive = [0.0] * n if closed else arrival_times(n, request_rate, burstiness, seed)
    records: list[RequestRecord] = []
    sent = in_flight = 0
    last_pass = -1.0  # the clock of the previous submission pass
    while True:
        now = engine.clock
        while sent < n and in_flight < (cap if caps is None else caps[sent]) and arrive[sent] <= now:
            req = engine.submit(*sizes[sent])
            # Arrived since the last pass: sent on arrival (joins the next step); else it waited for a slot.
            req.submit_time = arrive[sent] if arrive[sent] > last_pass and not closed else now
            sent += 1
            in_flight += 1
        last_pass = now
        step = engine.step()
        if step is None:
            if sent >= n:
                break
            engine.advance_to(arrive[sent])  # idle until the next arrival
            continue
        if on_step is not None:
            on_step(engine, step)
        for req in step.finished:
            in_flight -= 1
            end, first, itls = req.finish_time, req.first_token_time, req.itls
            assert end is not None and first is not None and itls is not None  # all set once it finished
            records.append(RequestRecord(
                start=req.submit_time, end=end, output_tokens=req.generated,
                input_tokens=req.input_len, ttft=first - req.submit_time, itls=itls))
    st = engine.stats
    metrics = summarize(records, concurrency=concurrency if closed and caps is None else None,
                        percentiles=percentiles, slo=slo, accept_length=st.accept_length,
                        spec_step_fraction=st.spec_step_fraction, switches=st.switches)
    if engine_out is not None:
        engine_out.append(engine)
    return metrics, records


def run_sim(profile, arms: list[str], concurrencies: list[int], *, num_prompts: int | None = None,
            input_len: int = DEFAULT_WORKLOAD.input_len, output_len: int = DEFAULT_WORKLOAD.output_len,
            seed: int = 0, run_id: str = "", progress: bool = False, on_row=None,
            catch_up: bool = True) -> list[dict]:
    """One results row per (arm, concurrency), in that order; on_row(row) after each."""
    specs = {arm: arm_policy_spec(arm) for arm in arms}  # refuse a bad arm before any work
    for c in concurrencies:
        _check_level(c, num_prompts or 1, input_len, output_len)
    levels = [(arm, c) for arm in arms for c in concurrencies]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(levels), desc="dynspec sim", unit="level", file=sys.stderr)
    rows = []
    for arm, c in levels:
        metrics, _ = simulate_level(profile, arm, c, num_prompts=num_prompts, input_len=input_len,
                                    output_len=output_len, seed=seed, catch_up=catch_up)
        ids = dict(run_id=run_id, arm=arm, policy=specs[arm] or "none", backend="sim",
                   profile=profile.name, concurrency=c, repeat=0)
        row = make_row(ids, metrics)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return rows


# --- configuration and CLI ---------------------------------------------------------------

class SimConfig(Model):
    """What `dynspec sim` ran; saved beside its output."""

    profile: str
    arms: list[str] = Field(min_length=1)
    concurrencies: list[int] = Field(min_length=1)
    num_prompts: int | None = Field(None, ge=1)
    input_len: int = Field(DEFAULT_WORKLOAD.input_len, ge=1)
    output_len: int = Field(DEFAULT_WORKLOAD.output_len, ge=1)
    seed: int = 0
    run_id: str = ""
    out: str

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: list[str]) -> list[str]:
        for arm in arms:
            arm_policy_spec(arm)
        if len(set(arms)) != len(arms):
            raise ValueError("an arm is given twice")
        return arms

    @field_validator("concurrencies")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be >= 1")
        return levels

    @field_validator("out")
    @classmethod
    def _out(cls, out: str) -> str:
        if Path(out).suffix not in (".csv", ".parquet"):
            raise ValueError(f"{out}: results go to a .csv or .parquet file")
        return out


def parse_levels(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; ValueError names a bad item."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        try:
            levels.append(int(part))
        except ValueError:
            raise ValueError(f"concurrency {part!r} is not an integer (expected e.g. 1,2,4,8)") from None
    return levels


def config_path(out: str | Path) -> Path:
    """Where the resolved config of an output file goes: beside it."""
    out = Path(out)
    return out.with_name(out.name + ".config.json")


def _run(args) -> int:
    from dynspec.sim.profile import ProfileError, load_profile
    from dynspec.results import write_table

    prog = "dynspec sim"
    try:
        levels = parse_levels(args.concurrency)
        cfg = SimConfig(profile=args.profile, arms=args.arm or list(SIM_ARMS), concurrencies=levels,
                        num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                        seed=args.seed, run_id=args.run_id, out=args.out)
        profile = load_profile(cfg.profile)
    except (ValueError, ProfileError) as exc:  # pydantic's ValidationError is a ValueError
        print(input_error(prog, exc), file=sys.stderr)
        return 2
    from dynspec import provenance

    write_json(config_path(cfg.out), {"command": "sim", "config": cfg.model_dump(),
                                             "profile": profile.model_dump()})
    provenance.write(provenance.beside(cfg.out), "sim", cfg, argv=provenance.argv_of(args), profile=cfg.profile)
    rows: list[dict] = []

    def save(row: dict) -> None:  # the whole table, atomically, after every level
        rows.append(row)
        write_table(rows, cfg.out)

    run_sim(profile, cfg.arms, cfg.concurrencies, num_prompts=cfg.num_prompts, input_len=cfg.input_len,
            output_len=cfg.output_len, seed=cfg.seed, run_id=cfg.run_id, progress=args.progress, on_row=save)
    print(f"{'arm':32s} {'C':>5s} {'tok/s':>10s} {'accept':>7s} {'spec%':>6s} {'switches':>8s}")
    for r in rows:
        acc = "-" if math.isnan(r["accept_length"]) else f"{r['accept_length']:.2f}"
        frac = "-" if math.isnan(r["spec_step_fraction"]) else f"{100 * r['spec_step_fraction']:.0f}"
        print(f"{r['arm']:32s} {r['concurrency']:5d} {r['output_throughput']:10.1f} {acc:>7s} {frac:>6s} "
              f"{int(r['switches']):8d}")
    top = max(cfg.concurrencies)
    if profile.extrapolates(top):
        print(f"note: profile {profile.name} is measured up to batch {profile.steps[0].batch_size[-1]}; "
              f"step times beyond it are extrapolated", file=sys.stderr)
    print(f"wrote {cfg.out}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("sim", help="simulate arms x concurrency levels in virtual time -> results table")
    p.add_argument("--profile", required=True, help="a shipped profile name or a .yaml path")
    p.add_argument("--arm", action="append",
                   help=f"an arm ({', '.join(SIM_ARMS)} or policy:SPEC); repeat for more (default: all three)")
    p.add_argument("--concurrency", required=True, help="comma-separated levels, e.g. 1,2,4,8,16,32,64,128")
    p.add_argument("--num-prompts", type=int, default=None, help=f"requests per level (default max({DEFAULT_WORKLOAD.prompts_per_client}*C, "
                        f"{DEFAULT_WORKLOAD.min_prompts}))")
    p.add_argument("--input-len", type=int, default=field_default(SimConfig, "input_len"),
                   help="prompt tokens per request (default %(default)s)")
    p.add_argument("--output-len", type=int, default=field_default(SimConfig, "output_len"),
                   help="generated tokens per request (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", default="")
    p.add_argument("--out", required=True, help="FILE.csv or FILE.parquet")
    p.add_argument("--progress", action="store_true", help="a progress bar on stderr")
    p.set_defaults(func=_run)
