"""A deliberately broken child for the host's robustness tests: `broken.py MODE`.

It is the reference environment until its first `step` request (every one for `flaky`
below), then, by MODE:
  crash     exits with status 3 after writing a traceback-like line to stderr
  hang      never answers
  garbage   answers with a line that is not JSON
  oversized answers with one line of 4 MiB
  wrongseq  answers with a reply for a request it was never sent
  flaky     crashes on the first step of every episode whose seed is even
  crash-if PATH   crashes at every step while the file PATH exists (the reference
            environment otherwise)
  slow      is correct but sleeps 0.3 s in every reset and step
  every K   crashes at every K-th step request it receives (a restarted child counts
            from 0 again: it answers K-1 steps, then crashes)
  once PATH crashes at its first step unless the file PATH exists, creating it first: one
            crash in the life of the whole test, however many children are started
  sleeponce PATH S  sleeps S seconds at its first step unless PATH exists (creating it
            first): one reply late once
and at `hello`:
  oldproto  claims protocol 0
  nodims    describes no dimensions
  silent    never answers hello
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import reference  # noqa: E402
import rlany_protocol  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "crash"
OUT = sys.stdout
STEPS = 0  # step requests this child received


def first_time(path):
    """True the first time any child asks (the marker file did not exist; it does now)."""
    p = Path(path)
    if p.exists():
        return False
    p.write_text("1")
    return True


def misbehave():
    global STEPS
    STEPS += 1
    if MODE == "every" and STEPS % int(sys.argv[2]) == 0:
        print(f"Traceback: broken.py crashed at step request {STEPS}", file=sys.stderr, flush=True)
        sys.exit(5)
    if MODE == "once" and first_time(sys.argv[2]):
        print("Traceback: broken.py crashed once", file=sys.stderr, flush=True)
        sys.exit(6)
    if MODE == "sleeponce" and first_time(sys.argv[2]):
        time.sleep(float(sys.argv[3]))
    if MODE == "slow":
        time.sleep(0.3)
        return
    if MODE == "crash-if" and not Path(sys.argv[2]).exists():
        return
    if MODE in ("crash", "crash-if"):
        print("Traceback: broken.py crashed on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "garbage":
        OUT.write("this is not json\n")
        OUT.flush()
        time.sleep(3600)
    if MODE == "oversized":
        OUT.write("x" * (4 << 20) + "\n")
        OUT.flush()
        time.sleep(3600)
    if MODE == "wrongseq":
        OUT.write(json.dumps({"seq": 123456, "observation": "at 1"}) + "\n")
        OUT.flush()
        time.sleep(3600)


class Broken(reference.Numberline):
    def describe(self):
        if MODE == "silent":
            time.sleep(3600)
        d = super().describe()
        if MODE == "nodims":
            d["dims"] = []
        return d

    def reset(self, difficulty, split, seed):
        if MODE == "slow":
            time.sleep(0.3)
        ep = super().reset(difficulty, split, seed)
        inner = ep.step

        def step(action):
            if MODE != "flaky" or (seed % 2 == 0 and ep.steps == 0):
                if MODE == "flaky":
                    sys.exit(4)
                misbehave()
            return inner(action)

        ep.step = step
        return ep


if __name__ == "__main__":
    if MODE == "oldproto":
        rlany_protocol.PROTOCOL = 0
    rlany_protocol.serve(Broken())
