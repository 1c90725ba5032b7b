"""Hardening of the slash commands: every bad line gets a clear answer and changes nothing.

The table-driven tests take their cases from `REGISTRY` itself: for every
command and argument they build valid lines, then lines with a wrong-typed,
out-of-range, surplus or missing argument, so a command added later is
covered without editing this file. The property tests feed arbitrary lines,
and sequences of lines, through `handle_line` (the REPL's own entry point)
and check after each one that nothing raised, that the settings still pass
their own validation and that a refused command changed nothing. Prompts are
recorded instead of answered (`QuietSession`), except in one smaller test that
answers them with the tiny pair.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from specrepl.app.commands.registry import (
    BOOL_WORDS,
    PREFIX,
    REGISTRY,
    Argument,
    Command,
    CommandRegistry,
)
from specrepl.app.commands.results import CommandFailed, HistoryCleared, Quit, SettingsChanged
from specrepl.app.render.repl import Renderer
from specrepl.app.repl import handle_line
from specrepl.chat.answers import Answer, EventCallback
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head_store import save_head, target_fingerprint
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_llama

HISTORY = [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
MESSAGE_MAX = 300
"""The longest error message a refused line may get (long input is cut, not repeated)."""


class QuietSession(ChatSession):
    """A session that records prompts instead of generating: only commands are under test."""

    def __init__(self, pair: ModelPair, settings: Settings | None = None) -> None:
        super().__init__(pair, settings)
        self.prompts: list[str] = []

    def answer(self, prompt: str, on_event: EventCallback | None = None) -> Answer:
        self.prompts.append(prompt)
        return Answer(
            prompt=prompt, mode=self.prompt_mode(), settings=self.settings, refusal="not generated"
        )


class RecordingRenderer(Renderer):
    """Draws into a string and keeps every command result it was asked to show."""

    def __init__(self) -> None:
        super().__init__(Console(file=io.StringIO(), width=100))
        self.results: list[object] = []

    def show(self, result: object) -> None:
        self.results.append(result)
        super().show(result)


@pytest.fixture
def session(pair: ModelPair) -> QuietSession:
    quiet = QuietSession(pair, Settings(max_new_tokens=8))
    quiet.history = [dict(message) for message in HISTORY]
    return quiet


# -- cases built from the registry -------------------------------------------------------


def _head_for_the_tiny_pair() -> Path:
    """A draft head (untrained) for the `pair` fixture's target: the one valid
    value of the head argument, which must name a head made for the target."""
    directory = Path(tempfile.mkdtemp(prefix="specrepl-head-"))
    target = tiny_llama(32, seed=4)
    head = DraftHead.for_target(target, torch.arange(16))
    save_head(
        head, directory, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    return directory


HEAD_DIRECTORY = _head_for_the_tiny_pair()


def valid_tokens(argument: Argument) -> list[str]:
    """Tokens the argument accepts: every choice of a choice argument, else one value."""
    if argument.kind is bool:
        return ["on"]
    if argument.setting == "drafter_runtime":
        # the tiny pair has no GGUF file: llama.cpp is refused for it (tested elsewhere)
        return [choice for choice in argument.choices if choice != "llamacpp"]
    if argument.choices:
        return list(argument.choices)
    if argument.setting == "drafter_head":
        return [str(HEAD_DIRECTORY)]
    if argument.setting is not None:
        bound = Settings.bound(argument.setting)
        if bound.kind is str:
            return ["text"]
        assert bound.low is not None and bound.high is not None, argument
        value = bound.low if bound.low_inclusive else (bound.low + bound.high) / 2
        return [str(int(value)) if bound.kind is int else repr(float(value))]
    options = argument.options()
    if options:
        return [options[0]]
    return {int: ["1"], float: ["0.5"]}.get(argument.kind, ["text"])


def invalid_tokens(argument: Argument) -> list[tuple[str, str]]:
    """(mistake, token) pairs the argument must refuse: wrong types, then values out of range."""
    if argument.rest:
        return []  # the rest of the line is text: nothing is of the wrong type
    if argument.setting == "drafter_head":
        return [("not a head", "no-such-head")]  # any text, but it must name a usable head
    mistakes: list[tuple[str, str]] = []
    if argument.kind is bool:
        mistakes += [("wrong type", "maybe"), ("wrong type", "2"), ("wrong type", "")]
    elif argument.kind is int:
        mistakes += [("wrong type", token) for token in ("2.5", "abc", "1_0", "\u0663", "0x1", "")]
    elif argument.kind is float:
        mistakes += [("wrong type", token) for token in ("abc", "1_0", "0.5.1", "\u0663", "")]
    elif argument.choices or argument.choices_of is not None:
        mistakes += [("wrong type", "no-such-choice"), ("wrong type", "x" * 900)]
    bound = None if argument.setting is None else Settings.bound(argument.setting)
    if bound is not None and bound.kind in (int, float):
        assert bound.low is not None and bound.high is not None, argument
        low = bound.low - 1 if bound.low_inclusive else bound.low
        for value in (low, bound.high + 1, bound.high * 1000):
            text = str(int(value)) if bound.kind is int else repr(float(value))
            mistakes.append(("out of range", text))
        mistakes.append(("out of range", "9" * 5000 if bound.kind is int else "1e999"))
        if bound.kind is float:
            mistakes += [("out of range", "nan"), ("out of range", "-inf")]
    return mistakes


def prefix_for(command: Command, target: Argument) -> list[str] | None:
    """Valid tokens for the arguments before `target` such that the next one is `target`.

    An argument that depends on another (`when`) gets that one set to a value
    it applies to. None when `target` cannot be reached positionally.
    """
    values: dict[str, str] = {}
    tokens: list[str] = []
    for argument in command.arguments:
        if argument is target:
            return tokens if argument.applies(values) else None
        if not argument.applies(values):
            continue
        if target.when is not None and target.when[0] == argument.name:
            token = target.when[1][0]
        else:
            token = valid_tokens(argument)[0]
        values[argument.name] = token
        tokens.append(token)
    raise AssertionError(f"{target.name} is not an argument of /{command.name}")


def full_lines(command: Command) -> Iterator[list[str]]:
    """Every line that gives each applicable argument a valid value (one per choice)."""

    def extend(index: int, values: dict[str, str], tokens: list[str]) -> Iterator[list[str]]:
        if index == len(command.arguments):
            yield tokens
            return
        argument = command.arguments[index]
        if not argument.applies(values):
            yield from extend(index + 1, values, tokens)
            return
        for token in valid_tokens(argument):
            yield from extend(index + 1, {**values, argument.name: token}, [*tokens, token])

    yield from extend(0, {}, [])


def _invalid_cases() -> list[Any]:
    cases = []
    for command in REGISTRY.commands:
        for argument in command.arguments:
            prefix = prefix_for(command, argument)
            for mistake, token in invalid_tokens(argument):
                quoted = repr(token) if token == "" or " " in token else token
                head = [PREFIX + command.name, *(prefix or [])]
                lines = [] if prefix is None else [" ".join([*head, quoted])]
                if not argument.rest:  # the same value given by name
                    lines.append(" ".join([*head, f"{argument.name}={quoted}"]))
                for line in lines:
                    case_id = f"{command.name}.{argument.name}:{mistake}:{token[:12]!r}"
                    cases.append(pytest.param(command, argument, line, id=case_id))
    return cases


INVALID_CASES = _invalid_cases()
FULL_LINES = [
    pytest.param(command, tokens, id=" ".join([command.name, *tokens]))
    for command in REGISTRY.commands
    if not any(argument.rest for argument in command.arguments)
    for tokens in full_lines(command)
]


def assert_refused(session: ChatSession, line: str) -> CommandFailed:
    """Dispatch a line that must be refused; check the answer is clear and nothing changed."""
    before, history = session.settings, [dict(message) for message in session.history]
    result = REGISTRY.dispatch(session, line)
    assert isinstance(result, CommandFailed), (line, result)
    assert result.message and "\n" not in result.message, result
    assert len(result.message) <= MESSAGE_MAX, result.message
    assert result.usage, result
    assert session.settings is before and session.settings == before
    assert session.history == history
    return result


def test_the_registry_gives_cases_for_every_argument() -> None:
    """Guard against an empty table: every non-text argument has refused values."""
    covered = {(c.name, a.name) for c, a, _ in (case.values for case in INVALID_CASES)}
    expected = {
        (command.name, argument.name)
        for command in REGISTRY.commands
        for argument in command.arguments
        if not argument.rest
    }
    assert expected <= covered
    assert len(INVALID_CASES) > 100
    assert {command.name for command, _ in (case.values for case in FULL_LINES)} >= {
        command.name
        for command in REGISTRY.commands
        if not any(argument.rest for argument in command.arguments)
    }


@pytest.mark.parametrize(("command", "argument", "line"), INVALID_CASES)
def test_bad_argument_is_refused_naming_the_valid_values(
    session: QuietSession, command: Command, argument: Argument, line: str
) -> None:
    result = assert_refused(session, line)
    if argument.setting == "drafter_head":
        assert "no draft head at no-such-head" in result.message, result.message
        assert result.usage == command.usage()
        return
    if argument.choices_of is not None and argument.setting is None and not argument.choices:
        # a value offered for completion only: the handler refuses it with its own answer
        assert argument.valid() in result.message or result.usage == "/help lists the commands"
    else:
        assert argument.valid() in result.message, result.message
        assert result.usage == command.usage()
    assert argument.name in result.message or command.name in result.message


@pytest.mark.parametrize(("command", "tokens"), FULL_LINES)
def test_surplus_argument_is_refused(
    session: QuietSession, command: Command, tokens: list[str]
) -> None:
    line = " ".join([PREFIX + command.name, *tokens])
    accepted = REGISTRY.dispatch(session, line)  # the full line itself is valid
    assert not isinstance(accepted, CommandFailed), (line, accepted)
    result = assert_refused(session, line + " surplus")
    assert result.message == "unexpected argument 'surplus'"
    assert result.usage == command.usage()


@pytest.mark.parametrize("command", REGISTRY.commands, ids=lambda command: command.name)
def test_bare_command_answers_or_names_what_is_missing(
    session: QuietSession, command: Command
) -> None:
    required = [argument for argument in command.arguments if argument.required]
    if required:
        result = assert_refused(session, PREFIX + command.name)
        assert result.message == f"missing {required[0].name} ({required[0].valid()})"
    else:
        result = REGISTRY.dispatch(session, PREFIX + command.name)
        assert not isinstance(result, CommandFailed), result


def test_a_missing_required_argument_names_its_values(session: QuietSession) -> None:
    """No shipped command has a required argument yet; the registry still handles one."""
    registry = CommandRegistry()

    @registry.command(
        "colour",
        help="pick a colour",
        arguments=(
            Argument("name", str, "a colour", choices=("red", "green"), required=True),
            Argument("shade", int, "how dark", setting="top_k"),
        ),
    )
    def colour(session: ChatSession, values: Any) -> Quit:
        return Quit()

    before = session.settings
    assert registry.dispatch(session, "/colour") == CommandFailed(
        "missing name (one of red, green)", "/colour red|green [shade]"
    )
    assert registry.dispatch(session, "/colour shade=3") == CommandFailed(
        "missing name (one of red, green)", "/colour red|green [shade]"
    )
    assert session.settings is before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("/gamma 0", "gamma must be an integer >= 1 and <= 64, got 0"),
        ("/gamma 65", "gamma must be an integer >= 1 and <= 64, got 65"),
        ("/gamma \u0663", "gamma must be an integer >= 1 and <= 64 or one of fixed"),
        ("/gamma 1_0", "got '1_0'"),
        ("/gamma 3 max=5", "give one number"),
        ("/", "no command name after /"),
        ('/help ""', "no command name after /"),
        ("/\x1b[31m", "unknown command '/\\x1b[31m'"),
        ("/" + "x" * 100_000, "(100001 characters)"),
        ("/seed " + "9" * 5000, "(5000 characters)"),
        ("/confidence ' 0.5'", "got ' 0.5'"),
        ("/processor multinomial 1e999", "temperature must be a number > 0 and <= 100.0, got inf"),
        ("/gamma " + "1 " * 6000, "the arguments are 12000 characters long; at most 10000"),
        ("/system", None),
    ],
)
def test_handler_level_refusals(session: QuietSession, line: str, message: str | None) -> None:
    if message is None:
        assert not isinstance(REGISTRY.dispatch(session, line), CommandFailed)
    else:
        assert message in assert_refused(session, line).message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("/gamma\t3", {"gamma": 3, "gamma_policy": "fixed"}),
        ("/gamma max=8", {"gamma": 8, "gamma_policy": "auto"}),
        ("/processor TOPK 0.5", {"processor": "topk", "temperature": 0.5}),
        ("/kind NGRAM", {"drafter_kind": "ngram"}),
        ("/confidence -0.0", {"confidence": 0.0}),
        ("/confidence .5", {"confidence": 0.5}),
        ("/seed +5", {"seed": 5}),
    ],
)
def test_lenient_but_unambiguous_forms(
    session: QuietSession, line: str, expected: dict[str, Any]
) -> None:
    result = REGISTRY.dispatch(session, line)
    assert isinstance(result, SettingsChanged), result
    assert {name: getattr(session.settings, name) for name in expected} == expected
    assert str(session.settings.confidence) != "-0.0"


def typos(name: str) -> list[str]:
    """A doubled last letter, a dropped letter and two swapped letters."""
    spellings = [name + name[-1]]
    if len(name) >= 4:
        spellings += [name[:-1], name[0] + name[2] + name[1] + name[3:]]
    return [spelling for spelling in spellings if REGISTRY.lookup(spelling) is None]


SPELLED_NAMES = [name for name in REGISTRY.names() if name[1:].replace("_", "").isalnum()]


@pytest.mark.parametrize("name", SPELLED_NAMES)
def test_unknown_command_suggests_the_nearest(session: QuietSession, name: str) -> None:
    command = REGISTRY.lookup(name)
    bare = name.removeprefix(PREFIX)
    for typo in typos(bare):
        result = assert_refused(session, PREFIX + typo)
        assert result.message.startswith(f"unknown command /{typo}; did you mean /"), result
        suggested = result.message.rsplit(" ", 1)[1].rstrip("?")
        assert REGISTRY.lookup(suggested) is command, (typo, suggested)
        assert result.usage == "/help lists the commands"


def test_a_name_far_from_every_command_gets_no_guess(session: QuietSession) -> None:
    assert assert_refused(session, "/xyzzy").message == "unknown command /xyzzy"


# -- properties ---------------------------------------------------------------------------

COMMAND_WORDS = [name.removeprefix(PREFIX) for name in REGISTRY.names()]
ARGUMENT_NAMES = sorted({a.name for c in REGISTRY.commands for a in c.arguments})
VALUE_WORDS = sorted(
    {option for c in REGISTRY.commands for a in c.arguments for option in a.options()}
    | set(BOOL_WORDS)
    | {"none", "NONE", "On", "inf", "-inf", "nan", "1e999", "0x10", "1_0", "\u0663", "", "''"}
)

numbers = st.one_of(
    st.integers(min_value=-100, max_value=100),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.floats(),
    st.floats(min_value=-2, max_value=2),
).map(str)
values = st.one_of(numbers, st.sampled_from(VALUE_WORDS), st.text(max_size=8))
named_values = st.builds("{}={}".format, st.sampled_from(ARGUMENT_NAMES), values)
tokens = st.one_of(values, named_values)
command_words = st.one_of(
    st.sampled_from(COMMAND_WORDS),
    st.sampled_from(COMMAND_WORDS).map(str.upper),
    st.text(max_size=12),
)
separators = st.sampled_from([" ", "  ", "\t", " \u00a0", "\u3000", " \x0b"])

registry_lines = st.builds(
    lambda word, separator, args: PREFIX + word + separator + " ".join(args),
    command_words,
    separators,
    st.lists(tokens, max_size=6),
)
slash_lines = st.builds(
    lambda args, lead: lead + PREFIX + " ".join(args),
    st.lists(st.one_of(tokens, st.text()), max_size=6),
    st.sampled_from(["", " ", "\t", "/"]),
)
long_lines = st.builds(
    lambda piece, times, lead: lead + piece * times,
    st.text(min_size=1, max_size=6),
    st.integers(min_value=200, max_value=5_000),
    st.sampled_from(["", "/", "/system ", "/gamma ", "/help "]),
)
named_lines = st.sampled_from(
    [
        *("/quit", "/exit", "/q", "/reset", "/clear", "/config", "/models", "/help"),
        *("/help gamma", "//gamma 3", "/", "/ ", "/system none", "/ngram", "/spec", "/debug"),
    ]
)
lines = st.one_of(registry_lines, slash_lines, st.text(), long_lines, named_lines)

CASES_ONE_LINE = 500
CASES_SEQUENCES = 150
CASES_GENERATING = 40
CASES_COMPLETION = 400


def valid_again(settings: Settings) -> bool:
    """The settings pass their own validation when built afresh from their values."""
    return Settings(**settings.as_dict()) == settings


def run_line(session: QuietSession, renderer: RecordingRenderer, line: str) -> None:
    """`handle_line` must not raise; check what a line may and may not change."""
    before, history = session.settings, [dict(message) for message in session.history]
    shown, prompts = len(renderer.results), len(session.prompts)
    going_on = handle_line(line, session, renderer)
    assert valid_again(session.settings), session.settings
    if not REGISTRY.is_command(line):
        assert going_on is True
        prompt = line.lstrip()[1:] if line.lstrip().startswith("//") else line
        assert session.prompts[prompts:] == [prompt]
        assert session.settings is before and session.history == history
        return
    assert len(renderer.results) == shown + 1 and len(session.prompts) == prompts
    result = renderer.results[-1]
    assert going_on is not isinstance(result, Quit)
    if isinstance(result, CommandFailed):
        assert result.message and "\n" not in result.message and result.usage
        assert len(result.message) <= MESSAGE_MAX, result.message
    if not isinstance(result, SettingsChanged):
        assert session.settings is before
    if not isinstance(result, HistoryCleared):
        assert session.history == history
    else:
        assert session.history == [] and result.turns == len(history)


@settings(
    max_examples=CASES_ONE_LINE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(line=lines)
def test_any_line_is_answered_and_keeps_the_settings_valid(pair: ModelPair, line: str) -> None:
    session = QuietSession(pair, Settings(max_new_tokens=8))
    session.history = [dict(message) for message in HISTORY]
    run_line(session, RecordingRenderer(), line)


@settings(
    max_examples=CASES_SEQUENCES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=st.lists(st.one_of(registry_lines, named_lines, lines), max_size=15))
def test_sequences_of_lines_on_one_session(pair: ModelPair, script: list[str]) -> None:
    session = QuietSession(pair, Settings(max_new_tokens=8))
    session.history = [dict(message) for message in HISTORY]
    renderer = RecordingRenderer()
    for line in script:
        run_line(session, renderer, line)


@settings(
    max_examples=CASES_GENERATING,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    script=st.lists(
        st.one_of(registry_lines, named_lines, st.text(max_size=40), st.just("w7 w8 w9")),
        max_size=8,
    )
)
def test_sequences_with_real_answers_on_the_tiny_pair(pair: ModelPair, script: list[str]) -> None:
    """Prompts are answered by the tiny pair; settings reached by any command must run."""
    session = ChatSession(pair, Settings(max_new_tokens=4))
    renderer = RecordingRenderer()
    for line in script:
        if not REGISTRY.is_command(line) and session.settings.max_new_tokens > 8:
            session.update(max_new_tokens=8)  # keep the test fast; any length was accepted
        handle_line(line, session, renderer)
        assert valid_again(session.settings), session.settings
        roles = [message["role"] for message in session.history]
        assert roles == ["user", "assistant"] * (len(roles) // 2)


@settings(max_examples=CASES_COMPLETION, deadline=None)
@given(text=st.one_of(registry_lines, slash_lines, st.text()))
def test_completion_never_raises(text: str) -> None:
    word, options = REGISTRY.completions(text)
    assert text.endswith(word) or text.lstrip() == word
    # command names complete whatever their case (`/K` becomes `/kind`, as `/KIND` runs it)
    assert all(
        isinstance(option, str) and option.lower().startswith(word.lower()) for option in options
    )


def test_quitting_and_resetting_mid_script(pair: ModelPair) -> None:
    """/quit ends the loop without touching the session; /reset clears only the history."""
    session = QuietSession(pair, Settings(max_new_tokens=8))
    session.history = [dict(message) for message in HISTORY]
    renderer = RecordingRenderer()
    assert handle_line("/gamma 5", session, renderer)
    settings_before = session.settings
    for line in ("/quit", "/exit", "/q", " /QUIT"):
        assert handle_line(line, session, renderer) is False
    assert session.settings is settings_before and session.history == HISTORY
    assert handle_line("/reset", session, renderer) is True
    assert session.history == [] and session.settings is settings_before
    assert renderer.results[-1] == HistoryCleared(2)
