"""Processes and HTTP: the sweep config (config), the sweep (sweep), the load generator (bench),
server processes (servers, server_info), saved results from other tools (readers) and prompts.

It never imports dynspec.analysis (tests/test_imports.py)."""
