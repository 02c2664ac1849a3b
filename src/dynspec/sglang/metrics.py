"""dynspec's Prometheus series on SGLang's /metrics (with --enable-metrics).

prometheus_client is imported only when an exporter is built: SGLang has it, the rest of the
runtime path (dynspec.sglang.hook) needs only the standard library and dynspec.policy."""

from __future__ import annotations


class PromExporter:
    """dynspec_* series for SGLang's /metrics (prometheus multiprocess mode): decode steps
    speculated and decoded plainly, mode switches, and the current mode."""

    def __init__(self, labels: dict[str, str], registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge  # imported only with --enable-metrics

        reg = REGISTRY if registry is None else registry
        names = sorted(labels)
        self.labels = labels
        self.spec = Counter("dynspec_steps_speculative", "Decode steps that speculated", names, registry=reg)
        self.plain = Counter("dynspec_steps_plain", "Decode steps decoded plainly", names, registry=reg)
        self.switches = Counter("dynspec_switches", "Speculate/plain mode switches", names, registry=reg)
        self.mode = Gauge("dynspec_mode", "1 while speculating, 0 while plain", names,
                          multiprocess_mode="mostrecent", registry=reg)
        self._switches_seen = 0
        self._c_spec = self.spec.labels(**labels) if names else self.spec
        self._c_plain = self.plain.labels(**labels) if names else self.plain
        self._c_sw = self.switches.labels(**labels) if names else self.switches
        self._g_mode = self.mode.labels(**labels) if names else self.mode
        self._g_mode.set(1)

    def step(self, spec: bool, switches: int) -> None:
        """One decode step decided (spec: it speculates); switches: the controller's switch count so far."""
        (self._c_spec if spec else self._c_plain).inc()
        if switches != self._switches_seen:
            self._c_sw.inc(switches - self._switches_seen)
            self._switches_seen = switches
            self._g_mode.set(1 if spec else 0)
