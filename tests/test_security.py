"""Nothing runs or connects that the user did not allow.

- The embedded default loads and answers with every socket blocked, and a hub
  id in offline mode never tries to connect.
- Repository code (`trust_remote_code`) is off unless explicitly opted in.
- Config files and typed input are data: nothing in them is evaluated.
- The prompt history file is readable by its owner only.
- The package source has no eval/exec, pickle loading or hard-wired remote code.

The socket blocker records every attempt; `test_the_blocker_sees_the_hub_client`
shows that it catches the connections the hub client and the reachability
probe really make, so an empty record means something.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants as hub_constants

import specrepl
from specrepl.app import cli
from specrepl.app.commands.registry import REGISTRY
from specrepl.app.commands.results import SettingsChanged
from specrepl.app.repl import _history
from specrepl.chat.config import AppConfig, ConfigError, load_config
from specrepl.chat.flags import app_config
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.models.errors import ModelLoadError
from specrepl.models.loading import load_pair
from specrepl.models.pair import ModelPair
from specrepl.models.sources import hub_reachable
from specrepl.models.specs import ModelSpec
from specrepl.store.paths import default_config_path

PACKAGE = Path(specrepl.__file__).resolve().parent
HUB_ID = "specrepl-tests/no-such-model"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class NetworkBlocked(OSError):
    """Raised by the blocked socket functions; an OSError, as a dead network gives."""


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Block every way to open a connection and record each attempt."""
    attempts: list[str] = []

    def refuse(name: str, skip_self: bool) -> Callable[..., Any]:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{name}{args[1:] if skip_self else args}")
            raise NetworkBlocked(f"the test blocks {name}")

        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("connect", True))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect_ex", True))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection", False))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo", False))
    return attempts


def hub_online(monkeypatch: pytest.MonkeyPatch, online: bool) -> None:
    """Offline mode on or off for huggingface_hub and transformers, with no proxy."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if online else "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", not online)
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


# -- no network ---------------------------------------------------------------------------


def test_the_blocker_sees_the_hub_client(
    no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub.utils import get_session

    hub_online(monkeypatch, True)
    with pytest.raises(Exception):  # noqa: B017 - whatever the client makes of a dead socket
        get_session().head(f"https://huggingface.co/api/models/{HUB_ID}", timeout=3)
    assert no_network, "the hub client connected past the blocker"
    no_network.clear()
    assert hub_reachable() is False
    assert len(no_network) == 1 and no_network[0].startswith("create_connection")


@pytest.mark.embedded
def test_the_embedded_default_runs_without_the_network(
    embedded_cache_dir: str, no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online mode is left on: the default must not even try, not merely be told not to."""
    hub_online(monkeypatch, True)
    config = load_config(default_config_path())
    pair = load_pair(
        config.target,
        config.drafter,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
    )
    session = ChatSession(pair, config.settings.updated(max_new_tokens=4))
    answer = session.answer("Say hello.")
    assert answer.refusal is None
    assert answer.runs["speculative"].result.new_tokens > 0
    assert answer.runs["speculative"].text
    assert no_network == []


def test_offline_mode_never_connects_for_a_hub_id(
    no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_online(monkeypatch, False)
    with pytest.raises(ModelLoadError) as error:
        load_pair(HUB_ID)
    message = str(error.value)
    assert HUB_ID in message and "--target embedded" in message and "\n" not in message
    assert no_network == []


def test_an_unreachable_hub_is_probed_once_then_explained(
    no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without offline mode: one short reachability probe, then local files only."""
    hub_online(monkeypatch, True)
    with pytest.raises(ModelLoadError) as error:
        load_pair(HUB_ID, HUB_ID + "-drafter")
    message = str(error.value)
    assert "could not reach the Hugging Face hub" in message
    assert "--target embedded" in message and "\n" not in message
    assert len(no_network) == 1 and no_network[0].startswith("create_connection")


# -- remote code is opt-in ----------------------------------------------------------------


def test_remote_code_is_off_unless_asked_for(tmp_path: Path) -> None:
    assert load_config(default_config_path()).trust_remote_code is False
    presets = Path(__file__).resolve().parent.parent / "configs"
    for preset in sorted(presets.glob("*.toml")):
        assert load_config(preset).trust_remote_code is False, preset
    assert AppConfig(target=ModelSpec("embedded")).trust_remote_code is False
    assert inspect.signature(load_pair).parameters["trust_remote_code"].default is False
    # nothing the REPL can change turns it on, and a model spec cannot carry it
    assert "trust_remote_code" not in Settings.names()
    assert "trust_remote_code" not in {f.name for f in dataclasses.fields(ModelSpec)}
    assert not any(
        "remote" in argument.name or "trust" in argument.name
        for command in REGISTRY.commands
        for argument in command.arguments
    )
    parser = cli.build_parser()
    assert app_config(parser.parse_args([])).trust_remote_code is False
    # opting in works, from the command line or from a config file
    assert app_config(parser.parse_args(["--trust-remote-code"])).trust_remote_code is True
    opted_in = tmp_path / "trusting.toml"
    opted_in.write_text('trust_remote_code = true\n[target]\nsource = "embedded"\n')
    assert app_config(parser.parse_args(["--config", str(opted_in)])).trust_remote_code


# -- configs and input are data -----------------------------------------------------------


def test_config_strings_are_never_evaluated(
    tmp_path: Path, no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_online(monkeypatch, False)
    marker = tmp_path / "code-ran"
    payload = f"__import__('os').system('touch {marker}')"
    path = tmp_path / "payload.toml"
    path.write_text(
        f'device = "cpu"\n[target]\nsource = "{payload}"\n'
        f'[generation]\nsystem_prompt = "{payload}"\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.target.source == payload
    assert config.settings.system_prompt == payload
    with pytest.raises(ModelLoadError):
        load_pair(config.target, device=config.device)
    for text in (
        f'[target]\nsource = "embedded"\n[generation]\ngamma = "{payload}"\n',
        f'device = "{payload}"\n[target]\nsource = "embedded"\n',
        f'"{payload}" = 1\n[target]\nsource = "embedded"\n',
        f"[target]\nsource = {payload}\n",  # not even a string: a syntax error
    ):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError):
            load_config(path)
    assert not marker.exists()
    assert no_network == []


def test_typed_text_reaches_the_template_verbatim(pair: ModelPair, tmp_path: Path) -> None:
    """Prompts and the system prompt are message content, never template or Python code."""
    marker = tmp_path / "code-ran"
    session = ChatSession(pair, Settings(max_new_tokens=2))
    system = "{{ 7 * 7 }} {% for x in range(3) %}loop{% endfor %}"
    assert isinstance(REGISTRY.dispatch(session, f"/system {system}"), SettingsChanged)
    assert session.settings.system_prompt == system
    prompt = f"__import__('os').system('touch {marker}') {{{{ 6 * 7 }}}}"
    rendered = pair.tokenizer.apply_chat_template(session.messages(prompt), tokenize=False)
    assert system in rendered and prompt in rendered
    assert "looploop" not in rendered
    session.answer(prompt)
    assert not marker.exists()


# -- the history file ---------------------------------------------------------------------


def test_a_new_history_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "specrepl" / "history"
    _history(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_an_existing_history_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "history"
    path.write_text("# earlier prompts\n")
    path.chmod(0o644)
    _history(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "# earlier prompts\n"  # tightened, not replaced


# -- the source ---------------------------------------------------------------------------

EVALUATING = {"eval", "exec", "compile", "__import__", "breakpoint"}
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "subprocess"}
UNSAFE_ATTRIBUTES = {("os", "system"), ("os", "popen"), ("yaml", "load"), ("yaml", "unsafe_load")}


def _risky(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every call or import that could run code from data."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name in UNSAFE_MODULES]
            found += [(node.lineno, f"import {name}") for name in names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "") in UNSAFE_MODULES:
            found.append((node.lineno, f"from {node.module} import"))
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        keywords = {k.arg: k.value for k in node.keywords}
        if isinstance(function, ast.Name) and function.id in EVALUATING:
            found.append((node.lineno, f"{function.id}()"))
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
            pair = (function.value.id, function.attr)
            if pair in UNSAFE_ATTRIBUTES:
                found.append((node.lineno, ".".join(pair)))
            weights_only = keywords.get("weights_only")
            safe = isinstance(weights_only, ast.Constant) and weights_only.value is True
            if pair == ("torch", "load") and not safe:
                found.append((node.lineno, "torch.load without weights_only=True"))
        trust = keywords.get("trust_remote_code")
        if isinstance(trust, ast.Constant) and trust.value is True:
            found.append((node.lineno, "trust_remote_code=True"))
    return found


def test_the_scan_finds_what_it_looks_for() -> None:
    sample = (
        "import pickle\nfrom subprocess import run\neval(x)\nexec(y)\nos.system(c)\n"
        "torch.load(p)\ntorch.load(p, weights_only=True)\nf(trust_remote_code=True)\nm.eval()\n"
    )
    assert [what for _, what in _risky(ast.parse(sample))] == [
        "import pickle",
        "from subprocess import",
        "eval()",
        "exec()",
        "os.system",
        "torch.load without weights_only=True",
        "trust_remote_code=True",
    ]


def test_the_package_never_evaluates_input() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 40
    found = [
        f"{path.relative_to(PACKAGE).as_posix()}:{line}: {what}"
        for path in sources
        for line, what in _risky(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    ]
    # one exception, checked below: the llama.cpp trial runs fixed code in a child
    trial = [entry for entry in found if entry.startswith("engine/llamacpp.py:")]
    assert [entry.split(": ", 1)[1] for entry in trial] == ["import subprocess"]
    assert [entry for entry in found if entry not in trial] == []


def test_the_llamacpp_trial_runs_only_its_own_code_without_a_shell() -> None:
    """The one subprocess in the package: `sys.executable -c <module constant>`
    with the file's path and a thread count as arguments, never in the code."""
    tree = ast.parse((PACKAGE / "engine" / "llamacpp.py").read_text(encoding="utf-8"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "subprocess"
    ]
    assert [call.func.attr for call in calls] == ["run"]
    (call,) = calls
    assert "shell" not in {keyword.arg for keyword in call.keywords}
    argv = call.args[0]
    assert isinstance(argv, ast.List)
    assert ast.unparse(argv.elts[0]) == "sys.executable"
    assert [ast.unparse(element) for element in argv.elts[1:3]] == ["'-c'", "_TRIAL"]
    assert [ast.unparse(element) for element in argv.elts[3:]] == ["str(path)", "str(threads)"]
