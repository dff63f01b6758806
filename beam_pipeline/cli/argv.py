"""The command line's words checked before anything runs: flags no options class knows and bad
values as one UserError line, with a "did you mean" for a mistyped flag, command or value."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.cli.options import UserError


def _usage_error(message: str):
    raise UserError(message)


def check_args(argv: list[str], known: Iterable[str] = ()) -> None:
    """Rejects flags that no options class knows (Beam only warns: a misspelt `--ouput_dir`
    must be an error), naming the flag meant (`did_you_mean`), and bad values: Beam's parser
    of every options class (handed to `add_extra_args_fn`) parses `argv`, its usage errors
    raised as UserError. `known`: further flags of the verb (verify's), for the hints.
    """

    def strict(parser: argparse.ArgumentParser) -> None:
        parser.error = _usage_error
        _, unknown = parser.parse_known_args(argv)
        flags = [a for a in unknown if a.startswith("-")]
        if flags:
            every = [*known, "--labels", *(f"--{name}" for name in PipelineOptions([]).get_all_options())]
            hints = [did_you_mean(flag.split("=", 1)[0], every) for flag in flags]
            named = [f"{flag} ({hint})" if hint else flag for flag, hint in zip(flags, hints)]
            raise UserError(f"unrecognized arguments: {' '.join(named)}")

    PipelineOptions(argv).get_all_options(add_extra_args_fn=strict)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """'did you mean --output_dir?' for a mistyped `word` (a flag with dashes for underscores, or
    a close name, as difflib judges it), or None when nothing is close."""
    choices = list(dict.fromkeys(choices))
    if word.startswith("--"):
        underscored = "--" + word[2:].replace("-", "_")
        if underscored in choices:
            return f"did you mean {underscored}?"
        word = underscored
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f"did you mean {close[0]}?" if close else None
