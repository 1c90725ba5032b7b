"""The slash-command registry: parsing, bounds, state left alone on error, help and completion."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from specrepl.app.commands.registry import REGISTRY, Argument, Command, CommandRegistry, ShowHelp
from specrepl.app.commands.results import (
    ClearScreen,
    CommandFailed,
    HistoryCleared,
    Quit,
    SettingsChanged,
    ShowModels,
    ShowSettings,
    ShowWidths,
)
from specrepl.app.render.repl import Renderer
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import DRAFTER_KINDS, DRAFTER_SETTINGS, GAMMA_MAX, Settings
from specrepl.engine.processors import PROCESSORS
from specrepl.models.pair import ModelPair


@pytest.fixture
def session(pair: ModelPair) -> ChatSession:
    return ChatSession(pair, Settings(max_new_tokens=8))


def settings_after(session: ChatSession, line: str) -> Settings:
    result = REGISTRY.dispatch(session, line)
    assert isinstance(result, SettingsChanged), result
    return session.settings


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("/gamma 3", {"gamma": 3, "gamma_policy": "fixed"}),
        (f"/gamma {GAMMA_MAX}", {"gamma": GAMMA_MAX, "gamma_policy": "fixed"}),
        ("/gamma 1", {"gamma": 1, "gamma_policy": "fixed"}),
        ("/gamma heuristic", {"gamma_policy": "heuristic"}),
        ("/gamma confidence 6", {"gamma_policy": "confidence", "gamma": 6}),
        ("/gamma AUTO max=8", {"gamma_policy": "auto", "gamma": 8}),
        ("/confidence 0.7", {"confidence": 0.7}),
        ("/drafter_kind ngram", {"drafter_kind": "ngram"}),
        (
            "/drafter_kind ngram 5 on",
            {"drafter_kind": "ngram", "ngram_order": 5, "ngram_keep": True},
        ),
        ("/kind lookup 2", {"drafter_kind": "lookup", "lookup_max_ngram": 2}),
        (
            "/kind hybrid 4 256",
            {"drafter_kind": "hybrid", "lookup_max_ngram": 4, "drafter_window": 256},
        ),
        ("/kind ngram 4 off 3", {"drafter_kind": "ngram", "ngram_order": 4, "ngram_filler": 3}),
        ("/ngram", {"drafter_kind": "ngram"}),
        ("/ngram off", {"drafter_kind": "model"}),
        ("/length 200", {"max_new_tokens": 200}),
        ("/max 5", {"max_new_tokens": 5}),
        ("/seed 1234", {"seed": 1234}),
        ("/seed 0", {"seed": 0}),
        ("/processor greedy", {"processor": "greedy"}),
        ("/processor multinomial 0.7", {"processor": "multinomial", "temperature": 0.7}),
        ("/processor topk 0.5 20", {"processor": "topk", "temperature": 0.5, "top_k": 20}),
        (
            "/processor nucleus 0.8 0.95",
            {"processor": "nucleus", "temperature": 0.8, "top_p": 0.95},
        ),
        (
            "/processor topknucleus 0.6 10 0.5",
            {"processor": "topknucleus", "temperature": 0.6, "top_k": 10, "top_p": 0.5},
        ),
        (
            "/processor nucleus top_p=0.3",
            {"processor": "nucleus", "temperature": 1.0, "top_p": 0.3},
        ),
        ("/proc topk top_k=7", {"processor": "topk", "top_k": 7, "temperature": 1.0}),
        ("/processor multinomial", {"processor": "multinomial", "temperature": 1.0}),
        ("/speculative off", {"speculative": False}),
        ("/spec", {"speculative": False}),
        ("/target_gen off", {"target_gen": False}),
        ("/target", {"target_gen": False}),
        ("/drafter_gen on", {"drafter_gen": True}),
        ("/drafter", {"drafter_gen": True}),
        ("/cache", {"use_cache": False}),
        ("/cache off", {"use_cache": False}),
        ("/cache on", {"use_cache": True}),
        ("/debug", {"debug": True}),
        ("/debug yes", {"debug": True}),
        ("/chat", {"chat": False}),
        ("/chat OFF", {"chat": False}),
        ("/system You are terse.", {"system_prompt": "You are terse."}),
        ("/GAMMA 2", {"gamma": 2, "gamma_policy": "fixed"}),
    ],
)
def test_valid_commands_change_exactly_their_settings(
    session: ChatSession, line: str, expected: dict[str, Any]
) -> None:
    before = session.settings.as_dict()
    after = settings_after(session, line).as_dict()
    assert {name: after[name] for name in expected} == expected
    untouched = set(before) - set(expected)
    assert {name: after[name] for name in untouched} == {name: before[name] for name in untouched}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("/gamma 0", "gamma must be an integer >= 1 and <= 64, got 0"),
        (f"/gamma {GAMMA_MAX + 1}", "<= 64"),
        ("/gamma three", "gamma must be an integer >= 1 and <= 64 or one of fixed, heuristic"),
        ("/gamma 2.5", "gamma must be an integer"),
        ("/gamma 3 4", "give one number"),
        ("/gamma auto 0", "max must be an integer >= 1"),
        ("/gamma auto 3 4", "unexpected argument '4'"),
        ("/confidence 1", "confidence must be a number >= 0 and <= 0.99"),
        ("/drafter_kind beam", "kind must be one of model, ngram, lookup"),
        ("/drafter_kind ngram 1", "order must be an integer >= 2"),
        ("/drafter_kind model 3 torch 4", "unexpected argument '4'"),
        ("/drafter_kind model -1", "window must be an integer >= 0"),
        ("/drafter_kind lookup order=3", "lookup takes no order"),
        ("/ngram maybe", "on must be one of on, off"),
        ("/length 0", "max_new_tokens must be an integer >= 1"),
        ("/length -5", "max_new_tokens must be"),
        ("/seed -1", "seed must be an integer >= 0"),
        ("/seed x", "seed must be"),
        ("/processor", None),
        ("/processor sampling", "name must be one of greedy, multinomial"),
        ("/processor 0.5", "name must be one of"),
        ("/processor multinomial 0", "temperature must be a number > 0"),
        ("/processor multinomial -1", "temperature must be a number > 0"),
        ("/processor multinomial nan", "temperature must be a number"),
        ("/processor multinomial 0.5 3", "unexpected argument '3'"),
        ("/processor topk 0.5 0", "top_k must be an integer >= 1"),
        ("/processor topk 0.5 2.5", "top_k must be an integer"),
        ("/processor nucleus 0.5 0", "top_p must be a number > 0 and <= 1"),
        ("/processor nucleus 0.5 1.5", "top_p must be a number > 0 and <= 1"),
        ("/processor greedy 0.5", "unexpected argument '0.5'"),
        ("/processor greedy temperature=0.5", "greedy takes no temperature"),
        ("/processor nucleus top_k=5", "nucleus takes no top_k"),
        ("/processor topk top_k=5 top_k=6", "top_k is given twice"),
        ("/processor temperature=2", "greedy takes no temperature"),
        ("/speculative maybe", "speculative must be on or off"),
        ("/cache on off", "unexpected argument 'off'"),
        ("/debug 2", "debug must be on or off"),
        ("/reset now", "unexpected argument 'now'"),
        ("/quit please", "unexpected argument 'please'"),
        ("/gama 3", "unknown command /gama; did you mean /gamma?"),
        ("/frobnicate", "unknown command /frobnicate"),
        ("/help nothing", "unknown command /nothing"),
        ('/processor "topk', "cannot read the arguments"),
    ],
)
def test_invalid_commands_change_nothing(
    session: ChatSession, line: str, message: str | None
) -> None:
    session.history = [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
    before, history = session.settings, list(session.history)
    result = REGISTRY.dispatch(session, line)
    if message is None:  # a bare query: shows, changes nothing
        assert isinstance(result, ShowSettings)
    else:
        assert isinstance(result, CommandFailed), result
        assert message in result.message
        assert result.usage
    assert session.settings is before
    assert session.history == history


def test_failed_command_shows_the_valid_form(session: ChatSession) -> None:
    result = REGISTRY.dispatch(session, "/processor topk 0.5 0")
    assert isinstance(result, CommandFailed)
    assert result.usage == "/processor [NAME] [temperature] [top_k] [top_p]"
    assert REGISTRY.dispatch(session, "/gamma 0") == CommandFailed(
        "gamma must be an integer >= 1 and <= 64, got 0",
        "/gamma [N|fixed|heuristic|confidence|auto] [N]",
    )


def test_processor_keeps_missing_parameters_and_reports_them(session: ChatSession) -> None:
    settings_after(session, "/processor topknucleus 0.5 10 0.8")
    result = REGISTRY.dispatch(session, "/processor topk 0.9")
    assert isinstance(result, SettingsChanged)
    assert [change.name for change in result.changes] == ["processor", "temperature"]
    assert (session.settings.top_k, session.settings.top_p) == (10, 0.8)
    assert session.settings.logits_processor().describe() == "topk(temperature=0.9, top_k=10)"
    settings_after(session, "/processor temperature=0.3")  # keeps the processor
    assert session.settings.processor == "topk"
    assert session.settings.temperature == 0.3


def test_toggles_flip_and_set(session: ChatSession) -> None:
    for name, setting in [
        ("speculative", "speculative"),
        ("target_gen", "target_gen"),
        ("drafter_gen", "drafter_gen"),
        ("cache", "use_cache"),
        ("debug", "debug"),
        ("chat", "chat"),
    ]:
        start = getattr(session.settings, setting)
        assert getattr(settings_after(session, f"/{name}"), setting) is (not start)
        assert getattr(settings_after(session, f"/{name}"), setting) is start
        assert getattr(settings_after(session, f"/{name} on"), setting) is True
        assert getattr(settings_after(session, f"/{name} on"), setting) is True
        assert getattr(settings_after(session, f"/{name} off"), setting) is False


def test_change_records_old_and_new(session: ChatSession) -> None:
    result = REGISTRY.dispatch(session, "/gamma 7")
    assert isinstance(result, SettingsChanged)
    assert [(c.name, c.old, c.new) for c in result.changes] == [
        ("gamma", 4, 7),
        ("gamma_policy", "auto", "fixed"),
    ]


def test_system_prompt_set_show_and_clear(session: ChatSession) -> None:
    settings_after(session, "/system   Answer in one word.  ")
    assert session.settings.system_prompt == "Answer in one word."
    shown = REGISTRY.dispatch(session, "/system")
    assert isinstance(shown, ShowSettings) and shown.names == ("system_prompt",)
    settings_after(session, "/system none")
    assert session.settings.system_prompt is None


def test_bare_setting_commands_show_the_value(session: ChatSession) -> None:
    drafter = ("drafter_kind", "ngram_order", "ngram_keep", "ngram_filler", "lookup_max_ngram",
               "drafter_window", "drafter_head", "drafter_runtime")  # fmt: skip
    for line, names in [
        ("/gamma", ("gamma_policy", "gamma")),
        ("/length", ("max_new_tokens",)),
        ("/seed", ("seed",)),
        ("/processor", ("processor", "temperature", "top_k", "top_p")),
        ("/drafter_kind", drafter),
        ("/config", tuple(Settings.names())),
        ("/settings", tuple(Settings.names())),
    ]:
        result = REGISTRY.dispatch(session, line)
        assert isinstance(result, ShowSettings)
        assert result.names == names


def test_drafter_kind_takes_every_drafter_option_by_its_short_name(
    pair: ModelPair, every_setting_changed: Settings
) -> None:
    """`/drafter_kind KIND NAME=VALUE` sets each drafter option, under the name the
    config file's [drafter] table gives it too."""
    command = REGISTRY.lookup("drafter_kind")
    assert command is not None
    assert [(a.name, a.setting) for a in command.arguments] == list(DRAFTER_SETTINGS.items())
    assert settings_after(ChatSession(pair), "/drafter_kind kind=ngram").drafter_kind == "ngram"
    # a head for the tiny target would have to be trained: the head is set back to none
    session = ChatSession(pair, Settings(drafter_head="unused"))
    for argument in command.arguments[1:]:
        assert argument.setting is not None and argument.when is not None
        value = getattr(every_setting_changed, argument.setting)
        kind = argument.when[1][0]
        if argument.setting == "drafter_head":
            value, kind = None, "hybrid"
        text = {True: "on", False: "off", None: "none"}.get(value, str(value))
        line = f"/drafter_kind {kind} {argument.name}={text}"
        assert getattr(settings_after(session, line), argument.setting) == value, line


def test_other_commands(session: ChatSession) -> None:
    session.history = [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
    assert REGISTRY.dispatch(session, "/reset") == HistoryCleared(2)
    assert session.history == []
    assert REGISTRY.dispatch(session, "/clear") == ClearScreen()
    assert REGISTRY.dispatch(session, "/quit") == Quit()
    assert REGISTRY.dispatch(session, "/exit") == Quit()
    assert REGISTRY.dispatch(session, "/q") == Quit()
    models = REGISTRY.dispatch(session, "/models")
    assert isinstance(models, ShowModels) and models.pair is session.pair
    help_all = REGISTRY.dispatch(session, "/help")
    assert isinstance(help_all, ShowHelp) and help_all.topic is None
    assert help_all.commands == REGISTRY.commands
    topic = REGISTRY.dispatch(session, "/help target")
    assert isinstance(topic, ShowHelp) and topic.topic is REGISTRY.lookup("target_gen")
    assert REGISTRY.dispatch(session, "/? /gamma") == ShowHelp(
        REGISTRY.commands, REGISTRY.lookup("gamma")
    )


def test_the_issue_lists_every_command() -> None:
    names = {command.name for command in REGISTRY.commands}
    expected = {
        "gamma", "processor", "length", "seed", "speculative", "target_gen", "drafter_gen",
        "cache", "debug", "chat", "reset", "clear", "config", "models", "help", "quit",
        "drafter_kind", "ngram",
    }  # fmt: skip
    assert expected <= names
    assert REGISTRY.lookup("target") is REGISTRY.lookup("target_gen")
    assert REGISTRY.lookup("drafter") is REGISTRY.lookup("drafter_gen")


def test_without_a_drafter_speculation_cannot_be_turned_on(pair: ModelPair) -> None:
    alone = ModelPair.from_models(pair.target.model, None, pair.tokenizer)
    session = ChatSession(alone)
    assert (session.settings.speculative, session.settings.drafter_gen) == (False, False)
    for line in ("/speculative", "/speculative on", "/drafter on"):
        result = REGISTRY.dispatch(session, line)
        assert isinstance(result, CommandFailed)
        assert "needs a drafter" in result.message
    assert session.settings.speculative is False


def test_help_is_generated_from_the_registry(session: ChatSession) -> None:
    console = Console(file=io.StringIO(), width=200, record=True)
    renderer = Renderer(console)
    renderer.show(REGISTRY.dispatch(session, "/help"))
    text = console.export_text()
    for command in REGISTRY.commands:
        assert command.usage() in text
        assert command.help in text
        for alias in command.aliases:
            assert f"/{alias}" in text
    renderer.show(REGISTRY.dispatch(session, "/help gamma"))
    assert "an integer >= 1 and <= 64" in console.export_text()


def test_a_new_command_gets_help_and_completion_for_free() -> None:
    registry = CommandRegistry()

    @registry.command(
        "colour",
        aliases=("color",),
        help="pick a colour",
        arguments=(Argument("name", str, "a colour", choices=("red", "green")),),
    )
    def colour(session: Any, values: Any) -> Quit:
        return Quit()

    assert registry.completions("/col") == ("/col", ["/colour", "/color"])
    assert registry.completions("/colour g") == ("g", ["green"])
    assert registry.dispatch(None, "/color red") == Quit()  # type: ignore[arg-type]
    failed = registry.dispatch(None, "/colour blue")  # type: ignore[arg-type]
    assert isinstance(failed, CommandFailed)
    assert failed.message == "name must be one of red, green, got 'blue'"
    assert failed.usage == "/colour [red|green]"
    with pytest.raises(ValueError, match="declared twice"):
        registry.add(Command("color", (), (), "again", colour))


@pytest.mark.parametrize(
    ("text", "word", "options"),
    [
        ("/ga", "/ga", ["/gamma"]),
        ("/GA", "/GA", ["/gamma"]),
        ("/proc", "/proc", ["/processor", "/proc"]),
        ("/tar", "/tar", ["/target_gen", "/target"]),
        ("/processor ", "", list(PROCESSORS)),
        ("/processor to", "to", ["topk", "topknucleus"]),
        ("/processor topk te", "te", ["temperature="]),
        ("/processor nucleus top", "top", ["top_p="]),
        ("/debug ", "", ["on", "off"]),
        ("/cache o", "o", ["on", "off"]),
        ("/chat of", "of", ["off"]),
        ("/help ga", "ga", ["gamma"]),
        ("/gamma ", "", ["fixed", "heuristic", "confidence", "auto"]),
        ("/drafter_kind ", "", list(DRAFTER_KINDS)),
        ("/system Be", "Be", []),
        ("/nothing x", "x", []),
        ("hello wor", "wor", []),
        ("hello", "hello", []),
    ],
)
def test_completion(text: str, word: str, options: list[str]) -> None:
    assert REGISTRY.completions(text) == (word, options)


def test_every_command_completes_from_its_prefix() -> None:
    for name in REGISTRY.names():
        assert name in REGISTRY.completions(name[:3])[1]


def test_lines_that_are_commands() -> None:
    assert REGISTRY.is_command("/gamma 3")
    assert REGISTRY.is_command("  /help")
    assert not REGISTRY.is_command("//etc/passwd is a path")
    assert not REGISTRY.is_command("hello /gamma")


def test_widths_shows_each_models_plan_and_retime_measures_again(session: ChatSession) -> None:
    session.pair.target.tuning.plan = None
    shown = REGISTRY.dispatch(session, "/widths")
    assert isinstance(shown, ShowWidths) and not shown.measured
    assert shown.plans["target"] is None and set(shown.plans) == {"target", "drafter"}
    measured = REGISTRY.dispatch(session, "/widths retime")
    assert isinstance(measured, ShowWidths) and measured.measured
    plan = measured.plans["target"]
    widths = range(1, max(session.settings.gamma, 8) + 2)
    assert plan is not None and set(plan.seconds) == set(widths)
    console = Console(file=io.StringIO(), width=160, record=True)
    Renderer(console).show(measured)
    shown_text = console.export_text()
    assert "forward widths (measured just now" in shown_text
    assert "weight-first products at widths" in shown_text
    assert isinstance(REGISTRY.dispatch(session, "/widths later"), CommandFailed)
