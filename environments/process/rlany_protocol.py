"""The serving side of the rlany process-environment protocol, version 1.

No dependencies beyond the standard library. An environment written in Python implements
the four methods of `Environment` below and calls `serve(MyEnvironment())`; `serve` reads
one JSON request per line on stdin and writes one JSON reply per line on stdout, exactly as
environments/process/PROTOCOL.md specifies. The protocol's stdout is kept for the protocol:
while a request is handled, `sys.stdout` points at stderr, so a stray `print` in the
environment goes to the host's error report instead of corrupting the stream.
"""

import json
import math
import random
import sys

PROTOCOL = 1


# Helpers for environment authors: what makes a task a pure function of (difficulty, split,
# seed), as the protocol requires.


def task_stream(env_name, seed, split, part):
    """A random stream for one part of one task. `random.Random` with a str seed hashes it
    with SHA-512: the same on every run and platform, whatever PYTHONHASHSEED is."""
    return random.Random(f"{env_name}/{split}/{seed}/{part}")


def stochastic_round(y, u):
    """floor(y) + [u < frac(y)]: with `u` from the task's own stream, a rewrite (same seed,
    another difficulty) keeps every other dimension's rounding."""
    return math.floor(y) + (1 if u < y - math.floor(y) else 0)


def difficulty_vector(difficulty, dims):
    """The first `dims` values of a difficulty, each clamped to [0, 1] (NaN is 0), padded
    with 0."""

    def clamp(x):
        x = float(x)
        return 0.0 if x != x else min(1.0, max(0.0, x))

    d = [clamp(x) for x in list(difficulty)[:dims]]
    return d + [0.0] * (dims - len(d))


class Environment:
    """What `serve` calls. Override every method."""

    def describe(self):
        """`{"name": str, "dims": [{"name": str, "lo": float, "hi": float}, ...],
        "eval_levels": [float, ...] (optional), "version": str (optional)}`."""
        raise NotImplementedError

    def reset(self, difficulty, split, seed):
        """A new episode object for the task (difficulty, split, seed): a pure function of
        its arguments. The object has `prompt` (str) and optionally `instructions` (str)
        and `key` (str), a method `step(action) -> dict` (see PROTOCOL.md), and optionally
        `close()`, called when the host closes the episode."""
        raise NotImplementedError

    def demo(self, difficulty, noise, seed):
        """The (flawed, with slip probability `noise`) expert's actions for the training
        task (difficulty, "train", seed): a list of strings."""
        raise NotImplementedError


def _handle(env, episodes, req):
    op = req.get("op")
    if op == "hello":
        if req.get("protocol") != PROTOCOL:
            return {"error": f"this environment speaks protocol {PROTOCOL}"}
        reply = dict(env.describe())
        reply["protocol"] = PROTOCOL
        return reply
    if op == "reset":
        ep = env.reset(list(req["difficulty"]), req["split"], int(req["seed"]))
        episodes[req["episode"]] = ep
        reply = {"prompt": ep.prompt}
        for field in ("instructions", "key"):
            value = getattr(ep, field, None)
            if value is not None:
                reply[field] = value
        return reply
    if op == "step":
        ep = episodes.get(req["episode"])
        if ep is None:
            return {"error": f"no episode {req['episode']}"}
        return dict(ep.step(str(req["action"])))
    if op == "demo":
        return {"actions": list(env.demo(list(req["difficulty"]), float(req["noise"]), int(req["seed"])))}
    if op == "close":
        ep = episodes.pop(req.get("episode"), None)
        if hasattr(ep, "close"):
            ep.close()
        return {}
    return {"error": f"unknown op {op!r}"}


def serve(env, stdin=None, stdout=None):
    """Answers requests until stdin closes."""
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    sys.stdout = sys.stderr
    episodes = {}
    for line in stdin:
        if not line.strip():
            continue
        seq = None
        try:
            req = json.loads(line)
            seq = req.get("seq")
            reply = _handle(env, episodes, req)
        except Exception as e:  # a failed request is an error reply, not a dead child
            reply = {"error": f"{type(e).__name__}: {e}"}
        reply["seq"] = seq
        out.write(json.dumps(reply) + "\n")
        out.flush()
