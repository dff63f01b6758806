"""cli: the command line. Options (options.py, image_options.py), help (help.py), the checks
before a job (checks.py, preflight.py), the local runner's defaults (local_runner.py; which
runner argv names: runners.py) and the terminal progress line (progress.py). Nothing in
transforms/ imports it.
"""
