"""Every option of every subcommand says what it does and its default in `--help`, and the
span sampling ratio has a flag."""

from __future__ import annotations

import argparse

import pytest

from eacgm_detector.cli import _parser as detector_parser
from otel_eacgm.cli import parser


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    return dict(action.choices)


def undocumented(p: argparse.ArgumentParser) -> list[str]:
    """Options (and positionals) whose help names no default (or says they are required)."""
    out = []
    for a in p._actions:  # noqa: SLF001
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        if a.help == argparse.SUPPRESS:
            continue
        if not a.help or not ("default:" in a.help or "(required)" in a.help):
            out.append("/".join(a.option_strings) or a.dest)
    return out


@pytest.mark.parametrize("name", ["agent", "trace", "doctor"])
def test_agent_subcommands_document_every_option_with_its_default(name: str) -> None:
    sub = subparsers(parser())[name]
    assert undocumented(sub) == []
    text = sub.format_help()
    assert "--launch-layer" in text and "--log-level" in text or name == "doctor"


@pytest.mark.parametrize("name", ["serve", "fit", "score"])
def test_detector_subcommands_document_every_option_with_its_default(name: str) -> None:
    assert undocumented(subparsers(detector_parser())[name]) == []


def test_defaults_in_help_are_the_settings_own() -> None:
    text = " ".join(subparsers(parser())["agent"].format_help().split())
    assert "(default: cuda.driver; setting launch_layer)" in text
    assert "(default: 0.1; setting span_sample_ratio)" in text
    fit = " ".join(subparsers(detector_parser())["fit"].format_help().split())
    assert "(default: 8; setting max_components)" in fit


def test_sample_ratio_flag_sets_the_span_sample_ratio() -> None:
    from otel_eacgm.config import load  # noqa: PLC0415

    args = parser().parse_args(["agent", "--sample-ratio", "0.25", "--", "true"])
    assert args.span_sample_ratio == 0.25
    assert load(None, {"span_sample_ratio": args.span_sample_ratio}, environ={}).span_sample_ratio == 0.25
    assert parser().parse_args(["trace", "--perfetto", "x.json", "--", "true"]).span_sample_ratio is None
