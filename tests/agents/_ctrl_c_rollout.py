"""A multi-turn rollout whose environment step sleeps 20 s, interrupted by a real SIGINT (Ctrl-C)
once the step runs: run as a script by ``test_user_code.py`` (a process of its own, as a user's
run is), which checks that the KeyboardInterrupt reaches the caller of ``generate`` at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.helpers import requests
from agents.test_user_code import SCRIPT_WORD, STEP_STARTED, SlowAsyncEnv, rollout

if __name__ == "__main__":
    SCRIPT_WORD["word"] = "2"
    mt = rollout(SlowAsyncEnv, env_timeout_s=30)

    def ctrl_c_during_the_step() -> None:
        if STEP_STARTED.wait(timeout=60):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_during_the_step, daemon=True).start()
    t0 = time.monotonic()
    try:
        mt.generate(requests(n_prompts=1, n=1))
    except KeyboardInterrupt:
        print(
            f"INTERRUPTED after {time.monotonic() - t0:.1f} s, step started: {STEP_STARTED.is_set()}",
            flush=True,
        )
        mt.shutdown()
        sys.exit(0)
    print(f"NOT INTERRUPTED: generate returned, step started: {STEP_STARTED.is_set()}", flush=True)
    sys.exit(1)
