"""goodput-k with its lead scaled by the K it runs, against the same policy with one lead (simulated).

goodput asks speculation for a lead over plain decoding: what requests finishing apart costs
beyond a step's time.  How far apart requests drift grows with the drafts a step may accept, so
goodput-k scales the lead set for the server's own K by E[accepted | K] / E[accepted | N]
(`steps.LEAD_BY_K`).  This reruns the adaptive arms of a committed K-envelope run
(`envelope.py --family N --candidate-steps 0,1,3,5,7 --level-scale 4`) on every one of its
member-levels, under the same simulator seed, with the lead by K on and off, and on/off goodput
beside them; the static arms, the oracle and SGLang's tiers are the committed rows (their code
is unchanged since they ran).  A member's rows go to a journal as it finishes (resumable).

    .venv/bin/python experiments/generated-machines/lead_by_k.py \\
        --rows experiments/generated-machines/data/family-0-k100-x4.csv.gz --out F.csv [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool
from pathlib import Path

import pandas as pd

from dynspec.analysis.family import level_requests, level_throughputs, member
from dynspec.analysis.family_k import summarize_k
from dynspec.io.atomic import write_frame
from dynspec.io.journal import Journal, JournalError, code_digest
from dynspec.policy.goodput import steps

# The one-lead arm last: a member leaves LEAD_BY_K as it found it (run_member restores it).
ARMS = {"goodput-k": ("policy:goodput-k", True), "goodput": ("policy:goodput", True),
        "goodput-k-one-lead": ("policy:goodput-k", False)}


def run_member(task: tuple[int, int, list[int], list[int], float, int]) -> list[dict]:
    family, index, levels, cands, range_ratio, level_scale = task
    m = member(family, index)
    rows, default = [], steps.LEAD_BY_K
    try:
        for c in levels:
            work = level_requests(m, c, range_ratio, level_scale)
            for name, (arm, lead_by_k) in ARMS.items():
                steps.LEAD_BY_K = lead_by_k
                whole, steady = level_throughputs(m.profile(), arm, c, 0, candidate_steps=cands, **work)
                rows.append({"member": index, "arm": name, "concurrency": c, "output_throughput": whole,
                             "steady_throughput": steady})
    finally:
        steps.LEAD_BY_K = default
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True, help="a committed K-envelope run (.csv.gz) with its provenance beside it")
    ap.add_argument("--out", required=True, help="the adaptive arms' rows (.csv); a journal beside it")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        committed = pd.read_csv(args.rows)
        with open(args.rows.removesuffix(".gz") + ".provenance.json") as f:
            ran = json.load(f)["config"]
    except (OSError, ValueError, KeyError) as exc:
        ap.error(f"--rows {args.rows}: not a K-envelope run with its provenance ({exc})")
    family, cands = ran["family_seed"], ran["candidate_steps"]
    levels = committed.groupby("member").concurrency.apply(lambda s: sorted(set(int(c) for c in s)))
    config = {"rows": args.rows, "family_seed": family, "candidate_steps": cands, "range_ratio": ran["range_ratio"],
              "level_scale": ran["level_scale"], "arms": ARMS, "code": code_digest()}
    try:
        journal = Journal(args.out + ".journal.jsonl", config)
    except JournalError as exc:
        ap.error(str(exc))
    tasks = [(family, int(i), lv, cands, ran["range_ratio"], ran["level_scale"]) for i, lv in levels.items()
             if f"member:{i}" not in journal.done]
    if args.jobs > 1:
        with Pool(args.jobs) as pool:
            for rows in pool.imap_unordered(run_member, tasks):
                journal.add(f"member:{rows[0]['member']}", rows)
    else:
        for task in tasks:
            rows = run_member(task)
            journal.add(f"member:{rows[0]['member']}", rows)
    fresh = pd.DataFrame([r for rows in journal.done.values() for r in rows])
    write_frame(args.out, fresh)
    from dynspec import provenance
    provenance.write(provenance.beside(args.out), "experiments/generated-machines/lead_by_k.py", config,
                     argv=sys.argv if argv is None else argv, outputs=[Path(args.out)])
    kept = committed[~committed.arm.isin(["goodput-k", "goodput"])]
    for label, k_arm in (("lead by K", "goodput-k"), ("one lead", "goodput-k-one-lead")):
        chosen = fresh[fresh.arm.isin([k_arm, "goodput"])].replace({"arm": {k_arm: "goodput-k"}})
        lines, _ = summarize_k(pd.concat([kept, chosen], ignore_index=True))
        print(f"family {family}, goodput-k with {label} (simulated, steady state):")
        print("\n".join(lines))
    t = fresh.pivot_table(index=["member", "concurrency"], columns="arm", values="steady_throughput")
    r = t["goodput-k"] / t["goodput-k-one-lead"]
    print(f"lead by K / one lead: worst {r.min():.3f}, median {r.median():.4f}, best {r.max():.3f}; "
          f"up > 0.5% at {(r > 1.005).sum()}, down > 0.5% at {(r < 0.995).sum()} of {len(r)} member-levels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
