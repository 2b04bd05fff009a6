#!/usr/bin/env python3
"""The plan's measures, paired by seed, for the consistency-outcome suite (standard library).

`rlany report` computes every row-against-row comparison of RESULT.md (report.md); this
script adds what it does not: the interaction (reward − frozen at slack 0) − (reward −
frozen at slack 2) on the judge's measures, and each measure in one table.

    python3 reports/results/consistency-outcome/paired.py RUNS_DIR [SEEDS]

RUNS_DIR holds `<experiment>/seed-<n>/metrics.jsonl` (the unpacked archive's
`consistency-outcome/`); SEEDS, comma-separated, defaults to 1..10.
"""
import json, math, os, sys

# Two-sided 95% Student-t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179}

def lines(runs, exp, seed):
    path = os.path.join(runs, exp, f"seed-{seed}", "metrics.jsonl")
    with open(path) as f:
        return [json.loads(l) for l in f]

def last_eval(ls, key):
    vals = [l[key] for l in ls if key in l and "eval/acc_id" in l]
    return vals[-1] if vals else None

def last_quarter(ls, key):
    steps = [l for l in ls if l.get("step", 0) > 0]
    n = max(l["step"] for l in steps)
    q = [l[key] for l in steps if l["step"] > n - n // 4 and key in l]
    return sum(q) / len(q) if q else None

def total(ls, key):
    return sum(l.get(key, 0.0) for l in ls if l.get("step", 0) > 0)

MEASURES = [
    ("P1 judge approves 6:L, pool, step 40", lambda ls: last_eval(ls, "judge/eval_approve/6:L")),
    ("P2 judge approves 6:L, policy's steps, last 1/4", lambda ls: last_quarter(ls, "judge/steps_approve/6:L")),
    ("judge approves right steps (p+), pool, step 40", lambda ls: last_eval(ls, "judge/eval_pos_acc")),
    ("judge rejects wrong steps (p-), pool, step 40", lambda ls: last_eval(ls, "judge/eval_neg_acc")),
    ("borderline balanced accuracy, pool, step 40", lambda ls: last_eval(ls, "judge/eval_bal_acc/borderline")),
    ("policy takes 6:L, last 1/4", lambda ls: last_quarter(ls, "env/situation/6:L")),
    ("policy takes 6:L in solved episodes, last 1/4", lambda ls: last_quarter(ls, "env/situation_solved/6:L")),
    ("policy takes 6:L in failed episodes, last 1/4", lambda ls: last_quarter(ls, "env/situation_failed/6:L")),
    ("training success, last 1/4", lambda ls: last_quarter(ls, "env/acc_mean")),
    ("greedy success at K, step 40", lambda ls: last_eval(ls, "eval/acc_start")),
    ("judge training samples (total)", lambda ls: total(ls, "judge/train_samples")),
]

def mean_half(xs):
    """Mean and 95% t half-width (None for one value) of xs."""
    n = len(xs)
    m = sum(xs) / n
    if n == 1:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, T95[n - 1] * sd / math.sqrt(n)

def ci(xs):
    """A paired difference: signed, with n, marked where the interval excludes 0."""
    if not xs:
        return "–"
    m, h = mean_half(xs)
    if h is None:
        return f"{m:+.3f} (n=1)"
    sep = " **excl. 0**" if abs(m) > h else ""
    return f"{m:+.3f} ± {h:.3f} (n={len(xs)}){sep}"

def mean_ci(xs):
    """A row's mean ± half-width."""
    if not xs:
        return "–"
    m, h = mean_half(xs)
    return f"{m:.3f} (n=1)" if h is None else f"{m:.3f} ± {h:.3f}"

def main():
    runs = sys.argv[1]
    seeds = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else list(range(1, 11))
    rows = {f"s{k}_{r}": f"cons_out_s{k}_{r}" for k in (0, 2) for r in ("frozen", "paper", "balanced")}
    vals = {name: {s: [f(lines(runs, exp, s)) for _, f in MEASURES] for s in seeds}
            for name, exp in rows.items()}
    print(f"Seeds: {seeds}\n")
    print("| measure | " + " | ".join(rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for i, (label, _) in enumerate(MEASURES):
        cells = [mean_ci([vals[r][s][i] for s in seeds if vals[r][s][i] is not None]) for r in rows]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nPaired by seed, mean ± 95% t half-width:\n")
    comps = [("paper − frozen, slack 0", "s0_paper", "s0_frozen"),
             ("balanced − frozen, slack 0", "s0_balanced", "s0_frozen"),
             ("paper − frozen, slack 2", "s2_paper", "s2_frozen"),
             ("balanced − frozen, slack 2", "s2_balanced", "s2_frozen"),
             ("balanced − paper, slack 0", "s0_balanced", "s0_paper"),
             ("balanced − paper, slack 2", "s2_balanced", "s2_paper"),
             ("frozen: slack 0 − slack 2", "s0_frozen", "s2_frozen")]
    print("| measure | " + " | ".join(c[0] for c in comps) + " | interaction, paper | interaction, balanced |")
    print("|---|" + "---:|" * (len(comps) + 2))
    for i, (label, _) in enumerate(MEASURES):
        cells = []
        for _, a, b in comps:
            d = [vals[a][s][i] - vals[b][s][i] for s in seeds
                 if vals[a][s][i] is not None and vals[b][s][i] is not None]
            cells.append(ci(d))
        for r in ("paper", "balanced"):
            d = []
            for s in seeds:
                v = [vals[x][s][i] for x in (f"s0_{r}", "s0_frozen", f"s2_{r}", "s2_frozen")]
                if None not in v:
                    d.append((v[0] - v[1]) - (v[2] - v[3]))
            cells.append(ci(d))
        print(f"| {label} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
