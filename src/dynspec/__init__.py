"""dynspec: when speculative decoding pays, and switching it off when it stops paying."""

__version__ = "0.1.0"
