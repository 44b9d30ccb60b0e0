"""`make bench`: the proxy against a pass-through baseline and a direct connection, on one machine.

Not collected by pytest (setup.cfg `norecursedirs`). Entry point: `python -m tests.bench --help`.
Modules: `upstream` (a fast fake SGLang server), `passthrough` (the baseline proxy), `procs`
(subprocesses, pinning, /proc counters), `load` (the one load-driving client), `report`.
"""
