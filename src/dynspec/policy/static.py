"""Policies that decide from the batch size or the step counter alone."""

from __future__ import annotations

import bisect
from typing import Sequence

from dynspec.policy.base import Policy, PolicySpecError


class Always(Policy):
    name = "always"

    def decide(self, batch_size: int) -> bool:
        return True


class Never(Policy):
    name = "never"

    def decide(self, batch_size: int) -> bool:
        return False


class _Dwell:
    """Holds a mode for at least `dwell` steps after every switch."""

    __slots__ = ("dwell", "mode", "step", "switched_at")

    def __init__(self, dwell: int, mode: bool):
        self.dwell = dwell
        self.mode = mode
        self.step = 0
        self.switched_at = -(1 << 62)  # the first switch may come at any step

    def key(self) -> tuple:
        return (self.mode, self.step, self.switched_at)

    def want(self, mode: bool) -> bool:
        self.step += 1
        if mode != self.mode and self.step - self.switched_at >= self.dwell:
            self.mode = mode
            self.switched_at = self.step
        return self.mode


class Threshold(Policy):
    """Speculate while the batch is small: off above `off`, back on at or below `on`."""

    name = "threshold"

    def __init__(self, on: int, off: int, dwell: int = 16):
        if on < 0 or off < on:
            raise PolicySpecError(f"threshold: need 0 <= on <= off, got on={on}, off={off}")
        if dwell < 0:
            raise PolicySpecError(f"threshold: dwell must be >= 0, got {dwell}")
        self.on, self.off = on, off
        self._dwell = _Dwell(dwell, True)

    def decide(self, batch_size: int) -> bool:
        mode = self._dwell.mode
        if mode and batch_size > self.off:
            mode = False
        elif not mode and batch_size <= self.on:
            mode = True
        return self._dwell.want(mode)

    def reason(self, batch_size: int) -> str:
        return f"threshold on<={self.on} off>{self.off}: batch {batch_size}"

    def spec(self) -> str:
        return f"threshold:on={self.on},off={self.off},dwell={self._dwell.dwell}"

    def state_key(self) -> tuple:
        return self._dwell.key()


class Cycle(Policy):
    """`spec` speculative steps, then `plain` plain ones, over and over, whatever the load.

    Not a policy to deploy: a stress test of switching.  Every speculative stretch begins
    right after a plain one, so its draft acceptance shows whether the plain steps kept the
    draft current, and the cost of a switch is paid as often as possible."""

    name = "cycle"

    def __init__(self, spec: int, plain: int):
        if spec < 1 or plain < 1:
            raise PolicySpecError(f"cycle: spec and plain must be >= 1, got spec={spec}, plain={plain}")
        self.n_spec, self.n_plain = spec, plain
        self._step = 0

    def decide(self, batch_size: int) -> bool:
        phase = self._step % (self.n_spec + self.n_plain)
        self._step += 1
        return phase < self.n_spec

    def spec(self) -> str:
        return f"cycle:spec={self.n_spec},plain={self.n_plain}"


class Table(Policy):
    """A batch-size -> on/off table (the shape vLLM, TensorRT-LLM and SGLang share), or a
    batch-size -> draft steps table (vLLM's K by batch size): a range's value is on, off or K."""

    name = "table"

    def __init__(self, ranges: Sequence[tuple[int, int | None, bool | int]], dwell: int = 0):
        # ranges: (low, high or None for open-ended, on or K), sorted and covering 1..inf.
        self.ranges = list(ranges)
        self._lows = [lo for lo, _, _ in self.ranges]
        self._on = [bool(on) for _, _, on in self.ranges]
        # K per range: an int K as given (nearest candidate), True as the server's own (on_steps)
        self._k = [None if isinstance(on, bool) else int(on) for _, _, on in self.ranges]
        self._dwell = _Dwell(dwell, self._on[0])

    def lookup(self, batch_size: int) -> bool:
        i = bisect.bisect_right(self._lows, batch_size) - 1
        return self._on[max(i, 0)]

    def decide(self, batch_size: int) -> bool:
        return self._dwell.want(self.lookup(batch_size))

    def decide_steps(self, batch_size: int) -> int:
        if not self.decide(batch_size):
            return 0
        k = self._k[max(bisect.bisect_right(self._lows, batch_size) - 1, 0)]
        return self.on_steps if k is None else self._nearest_positive(k)

    def reason(self, batch_size: int) -> str:
        return f"table: batch {batch_size} -> {'on' if self.lookup(batch_size) else 'off'}"

    def spec(self) -> str:
        def value(on: bool | int) -> str:
            return ("on" if on else "off") if isinstance(on, bool) else str(on)

        parts = [f"{lo}-{'' if hi is None else hi}={value(on)}" for lo, hi, on in self.ranges]
        return "table:" + ",".join(parts) + f",dwell={self._dwell.dwell}"

    def state_key(self) -> tuple:
        return self._dwell.key()

