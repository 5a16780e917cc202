"""A longer run of the text-path fuzzing in tests/test_fuzz.py (not part of the normal test run).

The properties are the tests' own (translate: one output line per input line, in order;
binarize: the ids read back are the tokenizer's); this script only runs them with many more
examples and a fresh random seed, and prints how long that took.

    python bench/fuzz.py                       # 500 examples per property
    python bench/fuzz.py --examples 5000 --seed 7
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=500, help="hypothesis examples per property")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("-k", default="", help="pytest -k expression to run only some properties")
    args = parser.parse_args()
    env = dict(os.environ, SEQTOOL_FUZZ_EXAMPLES=str(args.examples))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_fuzz.py"),
           "--hypothesis-show-statistics"]
    if args.seed is not None:
        cmd.append(f"--hypothesis-seed={args.seed}")
    if args.k:
        cmd += ["-k", args.k]
    start = time.monotonic()
    status = subprocess.call(cmd, cwd=ROOT, env=env)
    print(f"fuzz: {args.examples} examples per property, seed {args.seed if args.seed is not None else 'random'}: "
          f"{'passed' if status == 0 else 'FAILED'} in {time.monotonic() - start:.0f}s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
