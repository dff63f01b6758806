"""cli: the command line: options, help, pre-job checks, local runner defaults, process
start-up, progress line. Nothing in transforms/ imports it."""
