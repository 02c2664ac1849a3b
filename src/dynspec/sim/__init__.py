"""The simulator (numpy, pydantic): step-cost profiles and the shipped ones (profile, profiles/),
acceptance, the step engine, the simulated sweep (run: `dynspec sim`), seeded arrivals, the fit
of a profile to measured throughputs (fit) and the emulated server (emulator/).

It never imports dynspec.live or dynspec.analysis (tests/test_imports.py)."""
