#!/usr/bin/env python3
"""Exploratory, after the suite: the judges' majority verdicts on the logged in-domain
evaluation samples (`samples.jsonl`: two trajectories per evaluation, at steps 0, 20, 40),
split by the kind of door a step answered — borderline (sign 3-6, where the warm-started
policy errs) or clear — and by the oracle's label. Seeds pooled. Standard library only.

    python3 reports/results/corridor-table1/stage0b-observations/by_kind.py RUNS/corridor-table1-steps
"""
import collections
import glob
import json
import sys

ROWS = ["cor_t1s_frozen_judge", "cor_t1s_consistency", "cor_t1s_matched_synthetic_judge"]


def main():
    root = sys.argv[1]
    for row in ROWS:
        c = collections.Counter()
        for f in sorted(glob.glob(f"{root}/{row}/seed-*/samples.jsonl")):
            for line in open(f):
                t = json.loads(line)
                if t["split"] != "id":
                    continue
                # The sign step i answers: the task's first sign, then each observation.
                signs = [int(t["prompt"].strip().split("\n")[-1])]
                signs += [int(s["observation"]) if s["observation"].strip().isdigit() else None
                          for s in t["steps"]]
                for i, s in enumerate(t["steps"]):
                    if not s["verdicts"] or signs[i] is None:
                        continue
                    said_right = sum(s["verdicts"]) > 0
                    kind = "borderline" if 3 <= signs[i] <= 6 else "clear"
                    label = "right" if s["oracle"] else "wrong"
                    c[(kind, label, said_right == s["oracle"])] += 1
        print(row)
        for kind in ["clear", "borderline"]:
            for label in ["right", "wrong"]:
                ok, n = c[(kind, label, True)], c[(kind, label, True)] + c[(kind, label, False)]
                if n:
                    print(f"  {kind:10} {label} steps: majority verdict right {ok}/{n} = {ok / n:.2f}")


if __name__ == "__main__":
    main()
