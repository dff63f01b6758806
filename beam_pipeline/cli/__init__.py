"""cli: the command line. Options and their checks (options.py), help (help.py), the checks
before a job (checks.py), the local runner's defaults (local_runner.py), the CLI process's
start-up (startup.py) and the terminal progress line (progress.py). Nothing in transforms/
imports it.
"""
