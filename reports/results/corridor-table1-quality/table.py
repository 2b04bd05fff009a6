#!/usr/bin/env python3
"""Table 1 on the corridor with learned judges of controlled quality: the plan's numbers from
run directories (standard library only; the per-run measures and the statistics are the first
Table 1's, imported from ../corridor-table1/table1.py).

    python3 reports/results/corridor-table1-quality/table.py RUNS/corridor-table1-quality \
        [RUNS_OF/corridor-table1-steps]

Prints: the gate (each learned row's step-0 pool accuracy on borderline doors, by seed, and
the seeds gated out); every row's measures (mean and 95% Student-t half-width over seeds);
the judge by kind (pool at the first and last evaluation, the policy's own steps over the
first and last ten steps); every comparison of PLAN.md, paired by seed; and, given the
archived corridor-table1-steps runs, whether row 0 reproduced that suite's row 0.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corridor-table1"))
from table1 import fmt, load, mean_ci, print_table  # noqa: E402

P = "cor_t1q_"
ROWS = [P + r for r in ["outcome_only", "outcome_only_80_steps", "judge_a", "twin_a", "judge_b",
                        "twin_b", "judge_b_consistency"]]
LEARNED = [P + "judge_a", P + "judge_b", P + "judge_b_consistency"]
# (row, baseline) pairs of PLAN.md.
PAIRS = [(P + "outcome_only_80_steps", P + "outcome_only"),
         (P + "judge_a", P + "outcome_only"),
         (P + "twin_a", P + "outcome_only"),
         (P + "judge_b", P + "outcome_only"),
         (P + "twin_b", P + "outcome_only"),
         (P + "judge_b_consistency", P + "outcome_only"),
         (P + "twin_a", P + "judge_a"),
         (P + "twin_b", P + "judge_b"),
         (P + "judge_a", P + "judge_b"),
         (P + "judge_a", P + "outcome_only_80_steps"),
         (P + "judge_b", P + "outcome_only_80_steps"),
         (P + "twin_a", P + "outcome_only_80_steps"),
         (P + "twin_b", P + "outcome_only_80_steps"),
         (P + "judge_b_consistency", P + "judge_b")]
MEASURES = ["train_last", "start", "grid", "step_acc"]


def lines(path):
    return [json.loads(l) for l in open(path)]


def judge_by_kind(run):
    """The judge's borderline/clear accuracies: pool at the first and last evaluation, the
    policy's own steps averaged over the first and last ten steps."""
    ls = lines(os.path.join(run, "metrics.jsonl"))
    last = max(l["step"] for l in ls)

    def at(key, which):
        xs = [l[key] for l in ls if l.get(key) is not None]
        return xs[which] if xs else None

    def avg(key, lo, hi):
        xs = [l[key] for l in ls if lo <= l["step"] <= hi and l.get(key) is not None]
        return sum(xs) / len(xs) if xs else None

    out = {}
    for kind in ["borderline", "clear"]:
        out[f"pool_{kind}_first"] = at(f"judge/eval_bal_acc/{kind}", 0)
        out[f"pool_{kind}_last"] = at(f"judge/eval_bal_acc/{kind}", -1)
        out[f"steps_{kind}_first"] = avg(f"judge/steps_bal_acc/{kind}", 1, 10)
        out[f"steps_{kind}_last"] = avg(f"judge/steps_bal_acc/{kind}", last - 9, last)
    for k in ["pos", "neg"]:
        out[f"pool_borderline_{k}_first"] = at(f"judge/eval_{k}_acc/borderline", 0)
        out[f"steps_borderline_{k}_first"] = avg(f"judge/steps_{k}_acc/borderline", 1, 10)
    return out


def main():
    root = sys.argv[1]
    data = load(root, ROWS)
    print("## Gate (step-0 pool balanced accuracy on borderline doors, majority of 3 votes)\n")
    for row in LEARNED:
        d = os.path.join(root, row)
        if not os.path.isdir(d):
            continue
        cells = []
        for s in sorted(os.listdir(d)):
            for name, tag in [("metrics.jsonl", ""), ("gated.jsonl", " GATED OUT")]:
                f = os.path.join(d, s, name)
                if os.path.exists(f):
                    v = json.loads(open(f).readline()).get("judge/eval_bal_acc/borderline")
                    cells.append(f"{s}: {v:.3f}{tag}" if v is not None else f"{s}: –{tag}")
        print(f"- {row}: " + ", ".join(cells))
    print("\n## Rows (mean ± 95% t half-width over seeds)\n")
    print_table(data, ROWS, MEASURES)
    print("\nper seed (train_last / eval at k 30):")
    for row in ROWS:
        if row in data:
            print(" ", row, {s: (round(r["train_last"], 3), r["start"]) for s, r in sorted(data[row].items())})
    print("\n## The judge by kind (mean ± 95% t half-width over seeds)\n")
    keys = ["pool_borderline_first", "pool_borderline_last", "steps_borderline_first",
            "steps_borderline_last", "pool_clear_first", "steps_clear_first", "steps_clear_last",
            "pool_borderline_pos_first", "pool_borderline_neg_first",
            "steps_borderline_pos_first", "steps_borderline_neg_first"]
    print("| row | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    kinds = {}
    for row in ROWS[2:]:
        d = os.path.join(root, row)
        if not os.path.isdir(d):
            continue
        runs = {int(s.split("-")[1]): judge_by_kind(os.path.join(d, s)) for s in sorted(os.listdir(d))
                if os.path.exists(os.path.join(d, s, "metrics.jsonl"))}
        kinds[row] = runs
        cells = [fmt(mean_ci([r[k] for r in runs.values()])) for k in keys]
        print(f"| {row} | " + " | ".join(cells) + " |")
    print("\n## Paired by seed (row − baseline)\n")
    print("| row | baseline | seeds | Δ train, last ¼ | Δ eval at k 30 | Δ grid | Δ right-step share |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row, base in PAIRS:
        if row not in data or base not in data:
            continue
        seeds = sorted(set(data[row]) & set(data[base]))
        cells = []
        for k in MEASURES:
            diffs = [data[row][s][k] - data[base][s][k] for s in seeds
                     if data[row][s][k] is not None and data[base][s][k] is not None]
            cells.append(fmt(mean_ci(diffs), signed=True))
        print(f"| {row} | {base} | {len(seeds)} | " + " | ".join(cells) + " |")
    # P6: consistency's change of the judge on the policy's own steps, against the frozen judge.
    a, b = kinds.get(P + "judge_b_consistency"), kinds.get(P + "judge_b")
    if a and b:
        seeds = sorted(set(a) & set(b))
        for key in ["steps_borderline", "pool_borderline"]:
            change = lambda r: (r[f"{key}_last"] - r[f"{key}_first"]) if r[f"{key}_last"] is not None and r[f"{key}_first"] is not None else None
            diffs = [change(a[s]) - change(b[s]) for s in seeds
                     if change(a[s]) is not None and change(b[s]) is not None]
            print(f"\nP6: {key} last − first, consistency − frozen (judge B), {len(diffs)} seeds: "
                  f"{fmt(mean_ci(diffs), signed=True)}; per seed "
                  f"{[round(x, 3) for x in diffs]}")
    # What consistency training had to learn from: the judge's samples (verdicts of steps whose
    # m votes disagree, in groups inside the judge band), summed over the run, per seed.
    d = os.path.join(root, P + "judge_b_consistency")
    if os.path.isdir(d):
        counts = {}
        for s in sorted(os.listdir(d)):
            f = os.path.join(d, s, "metrics.jsonl")
            if os.path.exists(f):
                ls = lines(f)
                counts[s] = (int(sum(l.get("judge/train_samples", 0) for l in ls)),
                             round(sum(l.get("judge/verdict_pos_rate", 0) for l in ls if l["step"] > 0)
                                   / max(1, sum(1 for l in ls if l["step"] > 0)), 3))
        print(f"\nconsistency row: judge training samples over the run, mean + rate per seed: {counts}")
    if len(sys.argv) > 2 and P + "outcome_only" in data:
        old = os.path.join(sys.argv[2], "cor_t1s_outcome_only")
        same = []
        for s in sorted(data[P + "outcome_only"]):
            f_new = os.path.join(root, P + "outcome_only", f"seed-{s}", "metrics.jsonl")
            f_old = os.path.join(old, f"seed-{s}", "metrics.jsonl")
            if os.path.exists(f_old):
                a, b = lines(f_new), lines(f_old)
                # Keys both binaries write (the newer one adds per-kind keys), wall clock aside.
                equal = len(a) == len(b) and all(
                    x[k] == y[k] for x, y in zip(a, b) for k in set(x) & set(y) if not k.startswith("perf/"))
                same.append((s, equal))
        print(f"\nrow 0 against corridor-table1-steps' row 0, identical on every key both write "
              f"(wall clock aside): {same}")


if __name__ == "__main__":
    main()
