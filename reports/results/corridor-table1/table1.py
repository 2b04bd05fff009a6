#!/usr/bin/env python3
"""Table 1 on the corridor at k = 30: the plan's numbers from run directories (standard
library only).

    python3 reports/results/corridor-table1/table1.py RUNS_DIR/corridor-table1

Per row and seed: training success over the last quarter (mean `env/acc_mean`, steps 31-40
of 40; the primary measure of rows 0-3), `eval/acc_start` at the last evaluation (greedy,
256 corridors at the starting k = 30; the primary measure of rows 4-5 and the measure every
row shares), the grid `eval/acc_id`, the right-step share over the last quarter
(`env/step_acc`), the learned judge's balanced accuracy on its training steps
(`judge/train_bal_acc`, first and last ten steps) and on the pool (`judge/eval_bal_acc`,
first and last evaluation), and the difficulty over the last quarter. Then every row minus
row 0 and rows 2-5 minus row 1, paired by seed: mean and the half-width of the 95% Student-t
interval (PLAN.md).
"""
import json
import math
import os
import sys

# t(0.975, df) for df = 1..10.
T975 = [12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
        2.262157, 2.228139]

ROWS = ["cor_t1_outcome_only", "cor_t1_frozen_judge", "cor_t1_consistency",
        "cor_t1_consistency_balanced", "cor_t1_threshold", "cor_t1_gp"]


def mean_ci(xs):
    xs = [x for x in xs if x is not None]
    n = len(xs)
    if n == 0:
        return None
    m = sum(xs) / n
    if n == 1:
        return m, None, 1
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, T975[n - 2] * s / math.sqrt(n), n


def fmt(ci, signed=False):
    if ci is None:
        return "–"
    m, h, n = ci
    head = f"{m:+.3f}" if signed else f"{m:.3f}"
    tail = f" ± {h:.3f}" if h is not None else ""
    if signed and h is not None and (m - h > 0 or m + h < 0):
        head, tail = "**" + head, tail + "**"
    return head + tail + ("" if n >= 5 else f" (n={n})")


def read(run):
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    last = max(l["step"] for l in lines)
    q = max(last // 4, 1)

    def avg(key, lo, hi):
        xs = [l[key] for l in lines if lo <= l["step"] <= hi and l.get(key) is not None]
        return sum(xs) / len(xs) if xs else None

    def at(key, which):
        xs = [l[key] for l in lines if l.get(key) is not None]
        return xs[which] if xs else None

    return {
        "train_last": avg("env/acc_mean", last - q + 1, last),
        "start": at("eval/acc_start", -1),
        "start0": at("eval/acc_start", 0),
        "grid": at("eval/acc_id", -1),
        "step_acc": avg("env/step_acc", last - q + 1, last),
        "judge_train_first": avg("judge/train_bal_acc", 1, 10),
        "judge_train_last": avg("judge/train_bal_acc", last - 9, last),
        "judge_pool_first": at("judge/eval_bal_acc", 0),
        "judge_pool_last": at("judge/eval_bal_acc", -1),
        "difficulty_last": avg("env/difficulty/length", last - q + 1, last),
        "steps": last,
    }


def load(root, rows):
    """{row: {seed: read(run)}} for every run of `rows` under `root`."""
    data = {}
    for row in rows:
        d = os.path.join(root, row)
        if not os.path.isdir(d):
            continue
        for s in sorted(os.listdir(d)):
            if os.path.exists(os.path.join(d, s, "metrics.jsonl")):
                data.setdefault(row, {})[int(s.split("-")[1])] = read(os.path.join(d, s))
    return data


def print_table(data, rows, keys):
    """One line a row present in `data`: each measure's mean ± 95% interval over seeds."""
    print("| row | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for row in rows:
        if row in data:
            cells = [fmt(mean_ci([r[k] for r in data[row].values()])) for k in keys]
            print(f"| {row} | " + " | ".join(cells) + " |")


def main():
    root = sys.argv[1]
    data = load(root, ROWS)
    keys = ["train_last", "start", "grid", "step_acc", "judge_train_first", "judge_train_last",
            "judge_pool_first", "judge_pool_last", "difficulty_last"]
    print_table(data, ROWS, keys)
    print()
    print("per seed (train_last / start):")
    for row in ROWS:
        if row in data:
            print(" ", row, {s: (round(r["train_last"], 3), r["start"]) for s, r in sorted(data[row].items())})
    print()
    for base in ["cor_t1_outcome_only", "cor_t1_frozen_judge"]:
        if base not in data:
            continue
        print(f"paired by seed, minus {base}:")
        print("| row | Δ train, last ¼ | Δ eval at k 30 | Δ grid | Δ right-step share |")
        print("|---|---:|---:|---:|---:|")
        for row in ROWS:
            if row == base or row not in data or (base != ROWS[0] and ROWS.index(row) < 2):
                continue
            seeds = sorted(set(data[row]) & set(data[base]))
            cells = []
            for k in ["train_last", "start", "grid", "step_acc"]:
                diffs = [data[row][s][k] - data[base][s][k] for s in seeds
                         if data[row][s][k] is not None and data[base][s][k] is not None]
                cells.append(fmt(mean_ci(diffs), signed=True))
            print(f"| {row} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
