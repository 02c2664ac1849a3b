"""A policy that replays a script of decisions and records what it observes (for hook tests)."""

from dynspec.policy import Policy


class Scripted(Policy):
    name = "scripted"

    def __init__(self, modes, requests_up_to: int = 0, wants: bool = False):
        self.modes, self.records = list(modes), []
        self.requests_up_to, self.batches = requests_up_to, []
        self.wants = wants  # ask for a speculative step's ids above requests_up_to too
        self.prefills = []  # (requests, tokens, seconds) per note_prefill
        self.idle = []  # whether each came on an idle server

    def set_batch(self, requests):
        self.batches.append(None if requests is None else list(requests))

    def decide(self, batch_size):
        return self.modes.pop(0)

    def wants_requests(self, batch_size):
        return self.wants or super().wants_requests(batch_size)

    def observe(self, rec):
        self.records.append(rec)

    def note_prefill(self, requests, tokens, seconds=None, idle=False):
        self.prefills.append((requests, tokens, seconds))
        self.idle.append(idle)

    def reason(self, batch_size):
        return f"because {batch_size}"
