"""A policy that replays a script of decisions and records what it observes (for hook tests)."""

from dynspec.policy import Policy


class Scripted(Policy):
    name = "scripted"

    def __init__(self, modes):
        self.modes, self.records = list(modes), []

    def decide(self, batch_size):
        return self.modes.pop(0)

    def observe(self, rec):
        self.records.append(rec)

    def reason(self, batch_size):
        return f"because {batch_size}"
