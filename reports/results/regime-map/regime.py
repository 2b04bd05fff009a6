#!/usr/bin/env python3
"""The regime map's numbers from run directories (standard library only).

    python3 reports/results/regime-map/regime.py RUNS_DIR [SUITE ...]

For every suite folder under RUNS_DIR (default: every `regime-*`), per row and seed: training
success over the last quarter of the run (mean of `env/acc_mean`, steps 31-40 of 40), over
steps 1-5, the right-step share over the last quarter (`env/step_acc`), groups with outcome
signal over the first quarter (`policy/mixed_groups`, steps 1-10), the last greedy
evaluations (`eval/acc_start`, `eval/acc_id`), and — exploratory, chosen after the corridor's
primary measure was seen to saturate — training success over the whole run (steps 1-40). Then each row minus the suite's outcome-only
row, paired by seed: mean and the half-width of the 95% Student-t interval. Finally the
interactions the plan names (P3: the no-band judge's gain at 0.6 minus at 0.15; P4: at
slack 12 minus slack 4; C3: corridor k 20 minus k 10; P5: the label without foresight minus
today's at 0.6; D4, round 2: desktop 0.5 minus 0.25), paired by seed. Round 2 adds the
right-step share of the first quarter's rollouts and of their solved episodes, and the gap
between them (`env/step_acc_solved`, absent from round 1's logs). A row's baseline is the
one its suite.json names, looked up across all the suites read (the belief suite's rows pair with suite d060's outcome-only row).
"""
import json
import math
import os
import sys

# t(0.975, df) for df = 1..10.
T975 = [12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
        2.262157, 2.228139]


def mean_ci(xs):
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
    return head + (f" ± {h:.3f}" if h is not None else "") + ("" if n >= 4 else f" (n={n})")


def read(run):
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    last = max(l["step"] for l in lines)
    q = max(last // 4, 1)

    def avg(key, lo, hi):
        xs = [l[key] for l in lines if lo <= l["step"] <= hi and l.get(key) is not None]
        return sum(xs) / len(xs) if xs else None

    def by_kind(prefix):
        keys = sorted({k for l in lines for k in l if k.startswith(prefix)})
        return {k[len(prefix):]: (avg(k, 1, q), avg(k, last - q + 1, last)) for k in keys}

    def final(key):
        xs = [l[key] for l in lines if l.get(key) is not None]
        return xs[-1] if xs else None

    return {
        "last": last,
        "train_last_q": avg("env/acc_mean", last - q + 1, last),
        "train_first5": avg("env/acc_mean", 1, 5),
        # Exploratory (chosen after the corridor's ceiling was seen): the whole run's mean.
        "train_all": avg("env/acc_mean", 1, last),
        "right_last_q": avg("env/step_acc", last - q + 1, last),
        "mixed_first_q": avg("policy/mixed_groups", 1, q),
        "uniform_units_last_q": avg("policy/uniform_units", last - q + 1, last),
        "acc_start": final("eval/acc_start"),
        "acc_id": final("eval/acc_id"),
        # Round 2 (desktop; the logs of round 1 have neither): the right-step share of the
        # first quarter's rollouts, of its solved episodes, and the gap between them.
        "right_first_q": avg("env/step_acc", 1, q),
        "solved_right_first_q": avg("env/step_acc_solved", 1, q),
        # Round 3, first and last quarter ({kind: (first, last)}; empty in older logs): each
        # kind's share of the wrong steps (logged since the step kinds) and of all steps
        # (since the `regained` kind).
        "wrong_kinds": by_kind("env/wrong/"),
        "kinds": by_kind("env/kind/"),
    }


MEASURES = ["train_last_q", "acc_start", "acc_id", "right_last_q", "train_all",
            "train_first5", "mixed_first_q", "right_first_q", "solved_right_first_q", "gap_first_q"]


def suite_runs(root, suite):
    """{row: {seed: measures}} of the finished runs, and {row: baseline} from suite.json."""
    rows = {}
    base = os.path.join(root, suite)
    for row in sorted(os.listdir(base)):
        rdir = os.path.join(base, row)
        if not os.path.isdir(rdir):
            continue
        for seed in sorted(os.listdir(rdir)):
            run = os.path.join(rdir, seed)
            if os.path.exists(os.path.join(run, "metrics.jsonl")):
                r = read(run)
                a, b = r["solved_right_first_q"], r["right_first_q"]
                r["gap_first_q"] = a - b if a is not None and b is not None else None
                if r["last"] == 40:  # finished runs only
                    rows.setdefault(row, {})[int(seed.split("-")[1])] = r
    baselines = {}
    spec = os.path.join(base, "suite.json")
    if os.path.exists(spec):
        for r in json.load(open(spec))["rows"]:
            baselines[r["experiment"]] = r.get("baseline")
    return rows, baselines


def paired(a, b, key):
    seeds = sorted(set(a) & set(b))
    return [a[s][key] - b[s][key] for s in seeds
            if a[s][key] is not None and b[s][key] is not None]


def kinds_table(rows, field, title):
    """Per row, each kind's share (`field` of `read`), first quarter -> last, mean over seeds."""
    kinds = sorted({k for runs in rows.values() for r in runs.values() for k in r[field]})
    if not kinds:
        return
    print(f"\n{title}, steps 1-10 -> 31-40 (mean over seeds):\n")
    print("| row | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for row, runs in rows.items():
        cells = []
        for k in kinds:
            pairs_k = [r[field].get(k) for r in runs.values()]
            firsts = [p[0] for p in pairs_k if p and p[0] is not None]
            lasts = [p[1] for p in pairs_k if p and p[1] is not None]
            cells.append(f"{sum(firsts) / len(firsts):.3f} -> {sum(lasts) / len(lasts):.3f}"
                         if firsts and lasts else "–")
        print(f"| {row} | " + " | ".join(cells) + " |")


def report(root, suites):
    gains = {}
    loaded = {suite: suite_runs(root, suite) for suite in suites}
    everything = {row: runs for rows, _ in loaded.values() for row, runs in rows.items()}
    for suite in suites:
        rows, baselines = loaded[suite]
        print(f"\n## {suite}\n")
        print("| row | seeds | " + " | ".join(MEASURES) + " |")
        print("|---|---|" + "---|" * len(MEASURES))
        for row, runs in rows.items():
            cells = [fmt(mean_ci([r[k] for r in runs.values() if r[k] is not None]))
                     for k in MEASURES]
            print(f"| {row} | {','.join(map(str, sorted(runs)))} | " + " | ".join(cells) + " |")
        paired_rows = [(row, baselines.get(row)) for row in rows if baselines.get(row) in everything]
        if not paired_rows:
            continue
        print("\nPaired by seed, row − its baseline:\n")
        print("| row | baseline | " + " | ".join(MEASURES[:5]) + " |")
        print("|---|---|" + "---|" * 5)
        for row, base in paired_rows:
            runs, brow = rows[row], everything[base]
            cells = [fmt(mean_ci(paired(runs, brow, k)), True) for k in MEASURES[:5]]
            print(f"| {row} | {base} | " + " | ".join(cells) + " |")
            arm = row.split("_", 2)[-1]
            gains[(suite, arm)] = {s: runs[s]["train_last_q"] - brow[s]["train_last_q"]
                                   for s in set(runs) & set(brow)}
        for field, title in [("wrong_kinds", "What the wrong steps are: each kind's share of "
                              "the wrong steps"),
                             ("kinds", "What the steps are: each kind's share of all steps")]:
            kinds_table(rows, field, title)
    # The interactions the plan names, paired by seed, on the primary measure.
    pairs = [("P3", "regime-household-d060", "regime-household-d015"),
             ("P4", "regime-household-d035-slack12", "regime-household-d035"),
             ("C3", "regime-corridor-k20", "regime-corridor-k10"),
             ("C3b", "regime-corridor-k30", "regime-corridor-k10"),
             ("P5", "regime-household-d060-belief", "regime-household-d060"),
             ("D4", "regime-desktop-d050", "regime-desktop-d025")]
    lines = []
    for name, hi, lo in pairs:
        for arm in ["judge_band", "judge_no_band", "judge_decomposed"]:
            a, b = gains.get((hi, arm)), gains.get((lo, arm))
            if a and b:
                ds = [a[s] - b[s] for s in sorted(set(a) & set(b))]
                lines.append(f"| {name} | {arm} | {hi} − {lo} | {fmt(mean_ci(ds), True)} |")
    if lines:
        print("\nInteractions (gain on the primary measure at one setting minus at another, "
              "paired by seed):\n")
        print("| prediction | arm | settings | difference of gains |\n|---|---|---|---|")
        print("\n".join(lines))


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "runs"
    suites = sys.argv[2:] or sorted(d for d in os.listdir(root) if d.startswith("regime-"))
    report(root, suites)
