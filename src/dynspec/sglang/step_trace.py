"""The step trace (DYNSPEC_STEP_TRACE): one CSV line per result the scheduler processed.

Standard library only: it runs inside SGLang's scheduler (dynspec.sglang.hook opens it)."""

from __future__ import annotations

import time
from typing import Callable

ENV_STEP_TRACE = "DYNSPEC_STEP_TRACE"


class StepTrace:
    """One CSV line per result the scheduler processed: when (time.perf_counter, the system's
    monotonic clock on Linux: the load generator's request records use the same), what it was
    (S speculative step, P plain step, F prefill; in lower case when the step or prefill was
    launched), batch size (prefill results: requests whose prompts it finished), accepted drafts
    (step results) or prompt tokens (prefill results).  Lines are buffered and written about once a second (a killed server
    loses at most that); TP ranks > 0 write PATH.rankN."""

    HEADER = "t,kind,batch,count\n"

    def __init__(self, path: str, tp_rank: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.path = path if tp_rank == 0 else f"{path}.rank{tp_rank}"
        self._clock = clock
        self._flushed = clock()
        self._lines: list[str] = []
        with open(self.path, "w") as f:
            f.write(self.HEADER)

    def add(self, kind: str, batch: int, count: int) -> None:
        now = self._clock()
        self._lines.append(f"{now:.6f},{kind},{batch},{count}\n")
        if now - self._flushed > 1.0:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self._flushed = self._clock() if now is None else now
        lines, self._lines = self._lines, []
        try:
            with open(self.path, "a") as f:
                f.writelines(lines)
        except OSError:  # a trace must never stop a server
            pass
