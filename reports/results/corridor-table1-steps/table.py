#!/usr/bin/env python3
"""Table 1 on the corridor with a judge that sees observations: the plan's numbers from run
directories (standard library only; the per-run measures and the statistics are the first
Table 1's, imported from ../corridor-table1/table1.py).

    python3 reports/results/corridor-table1-steps/table.py RUNS/corridor-table1-steps \
        [RUNS_OF_THE_FIRST_TABLE_1/corridor-table1]

Prints: every row's measures (mean and 95% Student-t half-width over seeds); the gate (the
learned judge's pool balanced accuracy after its warm start); every row minus row 0, rows 1-2
minus row 4 and row 2 minus row 1, paired by seed; rows 1-2 on seeds 2-5 alone (seed 1 chose
the judge's settings); and, given the first Table 1's runs, whether row 0 reproduced its row 0.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corridor-table1"))
from table1 import fmt, load, mean_ci, print_table  # noqa: E402

ROWS = ["cor_t1s_outcome_only", "cor_t1s_frozen_judge", "cor_t1s_consistency",
        "cor_t1s_perfect_judge", "cor_t1s_matched_synthetic_judge"]
KEYS = ["train_last", "start", "grid", "step_acc", "judge_pool_first", "judge_pool_last",
        "judge_train_last"]


def votes(run):
    """The first pool evaluation's majority-vote accuracies on right and wrong steps."""
    for line in open(os.path.join(run, "metrics.jsonl")):
        m = json.loads(line)
        if m.get("judge/eval_vote_pos_acc") is not None:
            return m["judge/eval_vote_pos_acc"], m["judge/eval_vote_neg_acc"]
    return None, None


def paired(data, row, base, seeds=None):
    both = sorted(set(data[row]) & set(data[base]))
    if seeds is not None:
        both = [s for s in both if s in seeds]
    cells = []
    for k in ["train_last", "start", "grid", "step_acc"]:
        diffs = [data[row][s][k] - data[base][s][k] for s in both
                 if data[row][s][k] is not None and data[base][s][k] is not None]
        cells.append(fmt(mean_ci(diffs), signed=True))
    return cells


def stripped(path):
    """A metrics file without wall-clock keys."""
    out = []
    for line in open(path):
        m = json.loads(line)
        out.append({k: v for k, v in m.items() if not k.startswith("perf/")})
    return out


def main():
    root = sys.argv[1]
    data = load(root, ROWS)
    print_table(data, ROWS, KEYS)
    print()
    print("per seed (train_last / eval at k 30 / judge pool first):")
    for row in ROWS:
        if row in data:
            print(" ", row, {s: (round(r["train_last"], 3), r["start"], r["judge_pool_first"])
                             for s, r in sorted(data[row].items())})
    print()
    for row in ROWS[1:3]:
        if row in data:
            v = [votes(os.path.join(root, row, f"seed-{s}")) for s in sorted(data[row])]
            pos = mean_ci([p for p, _ in v if p is not None])
            neg = mean_ci([n for _, n in v if n is not None])
            first = mean_ci([r["judge_pool_first"] for r in data[row].values()])
            print(f"gate ({row}): pool balanced accuracy after the warm start {fmt(first)} "
                  f"(gate: mean >= 0.80 -> {'passes' if first and first[0] >= 0.8 else 'fails'}); "
                  f"majority vote right on right steps {fmt(pos)}, on wrong steps {fmt(neg)}")
    print()
    header = "| row | Δ train, last ¼ | Δ eval at k 30 | Δ grid | Δ right-step share |"
    for base, rows, seeds, what in [
        (ROWS[0], ROWS[1:], None, "minus outcome-only"),
        (ROWS[4], ROWS[1:3], None, "minus the matched synthetic judge"),
        (ROWS[1], ROWS[2:3], None, "minus the frozen learned judge"),
        (ROWS[0], ROWS[1:3], {2, 3, 4, 5}, "minus outcome-only, seeds 2-5 (seed 1 chose the judge)"),
    ]:
        if base not in data:
            continue
        print(f"paired by seed, {what}:")
        print(header)
        print("|---|---:|---:|---:|---:|")
        for row in rows:
            if row in data:
                print(f"| {row} | " + " | ".join(paired(data, row, base, seeds)) + " |")
        print()
    if len(sys.argv) > 2:
        old = os.path.join(sys.argv[2], "cor_t1_outcome_only")
        new = os.path.join(root, ROWS[0])
        same = []
        for s in sorted(data.get(ROWS[0], {})):
            a = os.path.join(old, f"seed-{s}", "metrics.jsonl")
            b = os.path.join(new, f"seed-{s}", "metrics.jsonl")
            if os.path.exists(a):
                same.append((s, stripped(a) == stripped(b)))
        print("row 0 against the first Table 1's row 0, metrics identical (wall-clock keys "
              f"aside): {same}")


if __name__ == "__main__":
    main()
