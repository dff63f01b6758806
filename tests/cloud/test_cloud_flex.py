"""The Flex Template spec (dataflow/metadata.json) matches ConvertOptions, and its values parse."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline import flex
from beam_pipeline.cli.argv import check_args
from beam_pipeline.cli.options import ConvertOptions, UserError, validate

METADATA = Path(__file__).resolve().parents[2] / "dataflow" / "metadata.json"


@pytest.fixture(scope="module")
def params() -> dict[str, dict]:
    spec = json.loads(METADATA.read_text())
    assert spec["name"] and spec["description"]
    return {p["name"]: p for p in spec["parameters"]}


def _convert_flags() -> dict[str, argparse.Action]:
    """ConvertOptions' flags by name (without the leading dashes)."""
    parser = argparse.ArgumentParser(add_help=False)
    ConvertOptions._add_argparse_args(parser)
    return {a.dest: a for a in parser._actions}


def test_the_flex_entry_knows_the_switches_by_their_defaults():
    switches = {n for n, a in _convert_flags().items() if isinstance(a, argparse._StoreTrueAction)}
    assert switches == {n for n, default in flex.convert_defaults().items() if default is False}
    assert {"overwrite", "quiet", "stratify", "dedupe"} <= switches


def _template_value(action: argparse.Action) -> str:
    """How the launcher would spell the flag's default (`--name=value`)."""
    if isinstance(action, argparse._StoreTrueAction):
        return "false"
    return "" if action.default is None else str(action.default)


def test_every_option_is_documented_and_nothing_else(params):
    flags = _convert_flags()
    assert set(params) == set(flags)
    for name, p in params.items():
        assert p["label"].strip() and len(p["helpText"]) > 20, name
        assert p["isOptional"] == (name not in ("input", "output_dir")), name
        assert p.get("regexes"), f"{name}: every parameter is validated by the launcher"


def test_regexes_accept_defaults_and_choices_and_reject_junk(params):
    flags = _convert_flags()
    for name, p in params.items():
        (regex,) = p["regexes"]
        action = flags[name]
        if action.default is not None:
            assert re.fullmatch(regex, _template_value(action)), name
        for choice in action.choices or ():
            assert re.fullmatch(regex, str(choice)), (name, choice)
        assert not re.fullmatch(regex, "--junk value"), name
    assert re.fullmatch(params["input"]["regexes"][0], "gs://my-bucket/images/flowers")
    assert not re.fullmatch(params["input"]["regexes"][0], "/home/me/flowers")
    assert re.fullmatch(params["splits"]["regexes"][0], "train=0.8,validation=0.1,test=0.1")


def test_launcher_style_arguments_parse_like_the_cli(params):
    argv = [f"--{name}={_template_value(a)}" for name, a in _convert_flags().items() if name in params]
    argv = [a for a in argv if not a.startswith(("--input=", "--output_dir="))]
    argv += ["--input=gs://b/in", "--output_dir=gs://b/out", "--overwrite=true", "--quiet=false"]
    normalized = flex.normalize_argv(argv)
    assert "--overwrite" in normalized and not any(a.startswith("--quiet") for a in normalized)
    check_args(normalized)
    opts = PipelineOptions(normalized).view_as(ConvertOptions)
    validate(opts)
    assert opts.overwrite is True and opts.quiet is False and opts.input == "gs://b/in"
    with pytest.raises(UserError, match="true or false"):
        flex.normalize_argv(["--overwrite=maybe"])
