"""`numberline`: the reference environment of the rlany process protocol (no dependencies).

Run it as `python3 environments/process/reference.py`; it speaks protocol 1 on stdin/stdout
(environments/process/PROTOCOL.md). It is small on purpose: the tests and the shipped smoke
experiment (experiments/process_smoke.ron) train on it, and it shows every part of the
protocol (difficulty dims, splits, an expert with slips, oracle labels, step dims, blame).

Task: walk along the number line from a start to a target.

    from 3 to 8, steps up to 2        <- the prompt
    +2                                <- an action: +N or -N, 1 <= N <= the largest step
    at 5                              <- the observation

Difficulty (2 dims, each clamped to [0, 1]):
  0 `distance`: |target - start| = 1 + sround(8 d0)   (1 .. 9)
  1 `stride`:   the largest step   = 1 + sround(2 d1)   (1 .. 3)
sround(y) = floor(y) + [u < frac(y)] with u from the task's own stream, so a rewrite (same
seed, another difficulty) keeps the start and the other dimension's rounding.

Splits: `train` draws from the seed, `eval` from a disjoint stream; `ood` walks *down*
(the target lies below the start), which training and eval tasks never do.

The episode ends when the walker stands on the target (won) or after the expert's number of
steps + 2. An action that does not parse or is too long a step is a wasted step
(`error: ...`). Oracle label: the step shortened the expert's remaining plan
(ceil(|target - position| / stride) steps). Step dims: `distance` always, `stride` when the
expert's move from that position is longer than 1. Blame: the step dims of a valid step
that made no progress.

Expert: move min(stride, remaining) towards the target. With probability `noise` per step
the flawed expert slips: it moves one less (or, for a 1-step, one step the wrong way).
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rlany_protocol  # noqa: E402

DIMS = [
    {"name": "distance", "lo": 1, "hi": 9},
    {"name": "stride", "lo": 1, "hi": 3},
]


def stream(seed, split, part):
    return rlany_protocol.task_stream("numberline", seed, split, part)


sround = rlany_protocol.stochastic_round


class Task:
    def __init__(self, difficulty, split, seed):
        d = rlany_protocol.difficulty_vector(difficulty, 2)
        space = "eval" if split == "eval" else ("ood" if split == "ood" else "train")
        distance = 1 + sround(8 * d[0], stream(seed, space, "round-distance").random())
        self.stride = 1 + sround(2 * d[1], stream(seed, space, "round-stride").random())
        self.start = stream(seed, space, "start").randint(0, 9)
        self.target = self.start - distance if split == "ood" else self.start + distance
        self.max_steps = self.plan_len(self.start) + 2
        self.prompt = f"from {self.start} to {self.target}, steps up to {self.stride}\n"

    def plan_len(self, pos):
        return math.ceil(abs(self.target - pos) / self.stride)

    def expert_move(self, pos):
        gap = self.target - pos
        n = min(self.stride, abs(gap))
        return n if gap > 0 else -n


class Episode:
    instructions = (
        "Walk along the number line from the first number to the second. Each step, write one "
        "move on its own line: +N or -N, where N is at least 1 and at most the largest step "
        "allowed. After each move you are told where you stand."
    )

    def __init__(self, task):
        self.task = task
        self.pos = task.start
        self.steps = 0
        self.prompt = task.prompt

    def step(self, action):
        t = self.task
        self.steps += 1
        before = t.plan_len(self.pos)
        exercised = [0] + ([1] if abs(t.expert_move(self.pos)) > 1 else [])
        text = action.strip()
        move = None
        if len(text) <= 8 and text[:1] in "+-" and text[1:].isdigit():
            move = int(text)
        if move is None or move == 0 or abs(move) > t.stride:
            obs = f"error: write +N or -N with 1 <= N <= {t.stride}"
            valid = False
        else:
            self.pos += move
            obs = f"at {self.pos}"
            valid = True
        won = self.pos == t.target
        label = valid and t.plan_len(self.pos) < before
        return {
            "observation": obs,
            "done": won or self.steps >= t.max_steps,
            "won": won,
            "label": label,
            "dims": exercised,
            "blame": exercised if valid and not label else [],
            "kind": "progress" if label else ("off_plan" if valid else "invalid"),
        }


class Numberline(rlany_protocol.Environment):
    def describe(self):
        return {"name": "numberline", "version": "1", "dims": DIMS}

    def reset(self, difficulty, split, seed):
        return Episode(Task(difficulty, split, seed))

    def demo(self, difficulty, noise, seed):
        t = Task(difficulty, "train", seed)
        slips = stream(seed, "train", "slip")
        pos, actions = t.start, []
        while pos != t.target and len(actions) < t.max_steps:
            move = t.expert_move(pos)
            if slips.random() < noise:
                move = move - (1 if move > 0 else -1) if abs(move) > 1 else -move
            pos += move
            actions.append(f"{move:+d}")
        return actions


if __name__ == "__main__":
    rlany_protocol.serve(Numberline())
