"""The command line: flags over the config, one-shot mode and its JSON, the piped REPL."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specrepl.app import cli
from specrepl.chat.flags import SETTING_FLAGS, add_setting_options, app_config
from specrepl.chat.settings import Settings
from specrepl.testing import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
RUN_FIELDS = {
    "text",
    "token_ids",
    "new_tokens",
    "seconds",
    "tokens_per_second",
    "time_to_first_token",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "steps",
}


@pytest.fixture(scope="module")
def config_file(tiny_config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair's config (conftest.py) with this file's generation settings."""
    models = tiny_config_file.read_text().split("[generation]")[0]
    path = tmp_path_factory.mktemp("cli") / "tiny.toml"
    path.write_text(models + "[generation]\nmax_new_tokens = 8\ngamma = 3\n")
    return path


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--config", "--target", "--drafter", "--device", "--dtype", "--quantize", "--gamma",
        "--processor", "--temperature", "--top-k", "--top-p", "--max-new-tokens", "--seed",
        "--no-cache", "--no-chat", "--trust-remote-code", "--prompt", "--json", "--retime-widths",
        "--gamma-policy", "--drafter-kind", "--drafter-head", "--ngram-order", "--ngram-keep",
        "--ngram-filler", "--lookup-max-ngram", "--drafter-window", "--no-speculative",
        "--no-target-gen", "--drafter-gen", "--debug", "--system-prompt", "--confidence",
    ):  # fmt: skip
        assert flag in text
    assert "an integer >= 1 and <= 64" in text  # the bounds come from Settings


def test_flags_override_the_config(config_file: Path) -> None:
    args = cli.build_parser().parse_args(
        [
            "--config", str(config_file), "--gamma", "6", "--processor", "topk", "--top-k", "9",
            "--temperature", "0.5", "--top-p", "0.7", "--max-new-tokens", "20", "--seed", "3",
            "--no-cache", "--no-chat", "--drafter-gen", "--dtype", "bfloat16",
            "--drafter-quantize", "8bit", "--device", "cpu", "--trust-remote-code",
            "--system-prompt", "Be brief.",
        ]
    )  # fmt: skip
    config = app_config(args)
    assert config.settings == Settings(
        gamma=6,
        gamma_policy="fixed",  # `--gamma N` is fixed, as `/gamma N` is
        processor="topk",
        top_k=9,
        temperature=0.5,
        top_p=0.7,
        max_new_tokens=20,
        seed=3,
        use_cache=False,
        chat=False,
        drafter_gen=True,
        system_prompt="Be brief.",
    )
    assert config.target.dtype == "bfloat16" and config.target.quantize is None
    assert config.drafter is not None
    assert config.drafter.quantize == "8bit" and config.drafter.dtype == "auto"
    assert config.trust_remote_code is True
    untouched = app_config(cli.build_parser().parse_args(["--config", str(config_file)]))
    assert untouched.settings == Settings(max_new_tokens=8, gamma=3)
    assert untouched.trust_remote_code is False
    no_drafter = app_config(
        cli.build_parser().parse_args(["--config", str(config_file), "--drafter", "none"])
    )
    assert no_drafter.drafter is None
    template_default = app_config(
        cli.build_parser().parse_args(["--config", str(config_file), "--system-prompt", "none"])
    )
    assert template_default.settings.system_prompt is None


def test_every_setting_is_reached_by_its_flag(
    config_file: Path, every_setting_changed: Settings
) -> None:
    argv = ["--config", str(config_file)]
    for flag in SETTING_FLAGS:
        value = getattr(every_setting_changed, flag.setting)
        if flag.switch is None:
            argv += [flag.flag, str(value)]
        elif value == flag.switch:
            argv.append(flag.flag)
    assert [flag.setting for flag in SETTING_FLAGS] == Settings.names()
    assert app_config(cli.build_parser().parse_args(argv)).settings == every_setting_changed
    after = cli.parse_arguments(["soak", *argv])  # the same flags after a subcommand
    assert app_config(after).settings == every_setting_changed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gamma", "0"], "--gamma: gamma must be an integer >= 1 and <= 64, got 0"),
        (["--top-p", "1.5"], "--top-p: top_p must be a number > 0 and <= 1"),
        (["--drafter-window", "-5"], "drafter_window must be an integer >= 0"),
        (["--processor", "beam"], "--processor: processor must be one of greedy"),
    ],
)
def test_a_bad_flag_value_is_refused_before_loading(
    config_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_main(["--config", str(config_file), *argv], capsys)
    assert code == 2
    assert message in " ".join(err.split())
    assert "Loading" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gamma", "1_0"], "argument --gamma: expected an integer or a policy"),
        (["--seed", "\u0663"], "argument --seed: expected an integer"),
        (["--temperature", "warm"], "argument --temperature: expected a number, got 'warm'"),
    ],
)
def test_flag_numbers_are_plain_decimals(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["--config", str(tmp_path / "missing.toml")], capsys)
    assert code == 2
    assert "no such config file" in err


def test_a_model_that_cannot_load_is_a_message(
    tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(
        ["--config", str(config_file), "--target", str(tmp_path / "nowhere"), "--prompt", "x"],
        capsys,
    )
    assert code == 1
    assert "✗" in err and "Traceback" not in err


def test_a_pair_with_different_tokenizers_is_a_message(
    tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    tiny_llama(32, seed=9).save_pretrained(other)
    tiny_tokenizer(32, word_prefix="v").save_pretrained(other)  # same size, other strings
    code, _, err = run_main(
        ["--config", str(config_file), "--drafter", str(other), "--prompt", "x"], capsys
    )
    assert code == 1
    assert "tokenizer" in err and "Traceback" not in err


def test_json_needs_a_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--json"])
    assert exit_info.value.code == 2
    assert "--json needs --prompt" in capsys.readouterr().err


def check_run(record: dict[str, object], speculative: bool) -> None:
    assert set(record) >= RUN_FIELDS
    assert record["new_tokens"] == len(record["token_ids"])  # type: ignore[arg-type]
    seconds, rate = record["seconds"], record["tokens_per_second"]
    assert isinstance(seconds, float) and isinstance(rate, float)
    assert rate == pytest.approx(record["new_tokens"] / seconds)  # type: ignore[operator]
    for name in ("drafted", "accepted", "acceptance_rate", "mean_accepted_length"):
        assert (record[name] is not None) is speculative


def test_one_shot_json_on_tiny_models(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(
        ["--config", str(config_file), "--prompt", "w7 w8", "--json", "--drafter-gen"], capsys
    )
    assert code == 0
    payload = json.loads(out)  # stdout holds the JSON object and nothing else
    assert set(payload) >= {"config", "runs", "speedup"}
    assert payload["config"]["gamma"] == 3 and payload["config"]["max_new_tokens"] == 8
    assert payload["config"]["target"]["kind"] == "directory"
    runs = payload["runs"]
    assert list(runs) == ["speculative", "target", "drafter"]
    check_run(runs["speculative"], speculative=True)
    check_run(runs["target"], speculative=False)
    check_run(runs["drafter"], speculative=False)
    assert runs["speculative"]["token_ids"] == runs["target"]["token_ids"]  # greedy: lossless
    assert payload["speculative_vs_target"] == {
        "identical": True,
        "first_difference": None,
        "greedy": True,
        "near_tie": None,
        "verdict": "identical",
    }
    assert payload["speedup"] == pytest.approx(
        runs["speculative"]["tokens_per_second"] / runs["target"]["tokens_per_second"]
    )
    assert "Loading models" in err  # progress goes to stderr


def test_one_shot_json_without_a_drafter(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(
        ["--config", str(config_file), "--drafter", "none", "--prompt", "w7", "--json"], capsys
    )
    assert code == 0
    payload = json.loads(out)
    assert list(payload["runs"]) == ["target"]
    assert payload["speedup"] is None and payload["config"]["drafter"] is None
    assert payload["speculative_vs_target"] is None  # nothing to compare


def test_one_shot_refusal_exits_non_zero(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(["--config", str(config_file), "--prompt", "  ", "--json"], capsys)
    assert code == 1
    payload = json.loads(out)
    assert payload["runs"] == {} and "empty" in payload["refusal"]


def test_one_shot_rendered(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--config", str(config_file), "--prompt", "w7 w8"], capsys)
    assert code == 0
    assert "speculative · model drafter · γ=auto≤3 · greedy" in out
    assert "target only · greedy" in out
    assert "baseline" in out
    assert "speculative vs target-only: identical tokens" in out
    assert "float32" in out  # the loaded models are shown


def test_piped_repl(
    config_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("/gamma 2\nw7 w8\n/models\n/quit\n"))
    code, out, _ = run_main(["--config", str(config_file)], capsys)
    assert code == 0
    assert "› /gamma 2" in out and "gamma: 3 → 2" in out
    assert "speculative · model drafter · γ=2" in out
    assert out.rstrip().endswith("Goodbye.")


def test_subcommands_can_be_added(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[argparse.Namespace] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        add_setting_options(parser)
        parser.add_argument("--rounds", type=int, default=1)

    def execute(args: argparse.Namespace) -> int:
        seen.append(args)
        return 5

    demo = cli.Subcommand("demo", "a subcommand for the test", configure, execute)
    monkeypatch.setattr(cli, "SUBCOMMANDS", [demo])
    assert cli.main(["demo", "--rounds", "3", "--gamma", "2"]) == 5
    assert seen[0].rounds == 3 and seen[0].gamma == ("fixed", 2)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "demo" in capsys.readouterr().out


@pytest.mark.embedded
def test_one_shot_json_on_the_embedded_pair(embedded_cache_dir: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECREPL_CACHE_DIR": embedded_cache_dir}
    completed = subprocess.run(
        [
            sys.executable, "infer.py", "--prompt", "What is the capital of France?", "--json",
            "--max-new-tokens", "24", "--drafter-gen",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(completed.stdout)
    assert set(payload) >= {"config", "runs", "speedup"}
    config = payload["config"]
    assert config["processor"] == "greedy" and config["max_new_tokens"] == 24
    assert config["target"]["parameters"] > 100_000_000
    runs = payload["runs"]
    assert list(runs) == ["speculative", "target", "drafter"]
    check_run(runs["speculative"], speculative=True)
    check_run(runs["target"], speculative=False)
    check_run(runs["drafter"], speculative=False)
    speculative, target = runs["speculative"], runs["target"]
    assert speculative["token_ids"] == target["token_ids"]
    assert "Paris" in speculative["text"]
    assert 0 < speculative["new_tokens"] <= 24
    assert speculative["steps"] < speculative["new_tokens"]  # drafts were accepted
    assert payload["speedup"] == pytest.approx(
        speculative["tokens_per_second"] / target["tokens_per_second"]
    )


def test_bench_subcommand_runs_through_main(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"question_id": 1, "category": "qa", "turns": ["w7 w8 w9"]}\n'
        '{"question_id": 2, "category": "math", "turns": ["w10 w11 w10 w11"]}\n'
    )
    out_json = tmp_path / "bench.json"
    code, out, _ = run_main(
        [
            "bench", "--config", str(config_file), "--prompts", str(prompts),
            "--max-new-tokens", "6", "--gamma", "3", "--warmup", "0", "--json", str(out_json),
        ],
        capsys,
    )  # fmt: skip
    assert code == 0, out
    report = json.loads(out_json.read_text())
    assert len(report["prompts"]) == 2
    assert "specrepl speculative" in out


def test_soak_subcommand_runs_through_main(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "soak.json"
    code, out, err = run_main(
        [
            "soak", "--config", str(config_file), "--prompts", "12", "--max-new-tokens", "4",
            "--reset-every", "3", "--json", str(out_json),
        ],
        capsys,
    )  # fmt: skip
    assert code == 0, out
    report = json.loads(out_json.read_text())
    assert report["passed"] is True
    assert report["config"]["max_new_tokens"] == 4 and report["config"]["prompts"] == 12
    result = report["result"]
    assert result["prompts"] == 12 and result["resets"] == 3 and result["mismatches"] == []
    assert result["compared"] + result["skipped"] == 12
    assert len(result["rss_samples"]) == 12 and result["growth"] is not None
    assert "OK: no mismatches" in out and "history resets" in out
    assert "soak: 12/12" in err  # progress goes to stderr


@pytest.mark.parametrize(
    "argv", [["--prompts", "0"], ["--reset-every", "-1"], ["--prompts", "5", "--warmup", "6"]]
)
def test_soak_refuses_bad_counts_before_loading(
    config_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run_main(["soak", "--config", str(config_file), *argv], capsys)
    assert code == 2
    assert "need --prompts >= 1" in err and "Loading" not in err


def test_the_launcher_starts_before_torch_and_the_package_names_load_on_use() -> None:
    import subprocess
    import sys

    import specrepl

    assert set(specrepl.__all__) == set(specrepl._MODULE_OF)
    for name in specrepl.__all__:
        assert getattr(specrepl, name) is not None
    probe = "import sys, specrepl.app.launcher; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # Ctrl-C during `import torch` is the launcher's


def test_replay_plays_a_chat_with_caches_kept_and_dropped(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chat_file = tmp_path / "chat.txt"
    chat_file.write_text("w7 w8 w9\nw10 w11\nw12 w13 w14\nw5 w6\n")
    out = tmp_path / "replay.json"
    argv = ["--config", str(config_file), "replay", str(chat_file), "--json", str(out)]
    code, text, _ = run_main(argv, capsys)
    assert code == 0, text
    assert "Both sessions gave the same tokens in every turn." in text
    result = json.loads(out.read_text())["result"]
    assert result["turns"] == 4 and result["mismatched_turns"] == []
    figures = result["figures"]
    assert {f["generator"] for f in figures} == {"speculative", "target"}
    for f in figures:
        if f["mode"] == "dropped" or f["turn"] == 0:
            assert f["fed"] == f["prompt_tokens"]
        else:
            assert f["fed"] < f["prompt_tokens"] // 2
    missing = ["--config", str(config_file), "replay", str(tmp_path / "missing.txt")]
    assert run_main(missing, capsys)[0] == 2


@pytest.mark.parametrize("where", ["before", "after"])
def test_bench_flags_mean_the_same_before_and_after_the_subcommand(
    where: str, tiny_config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model and setting flags reach `bench` wherever they are given (they were
    once ignored before it), and one given after `bench` wins over one before."""
    models = tiny_config_file.parent
    other_target, other_drafter = tmp_path / "other-target", tmp_path / "other-drafter"
    shutil.copytree(models / "target", other_target)
    shutil.copytree(models / "drafter", other_drafter)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["w7 w8 w9"]}\n')
    flags = [
        "--config", str(tiny_config_file), "--target", str(other_target),
        "--drafter", str(other_drafter), "--drafter-kind", "hybrid",
        "--gamma", "2", "--gamma-policy", "heuristic", "--confidence", "0.6",
        "--max-new-tokens", "5", "--processor", "topk", "--top-k", "3", "--seed", "11",
        "--no-cache",
    ]  # fmt: skip
    own = ["--prompts", str(prompts), "--warmup", "0", "--widths", "off",
           "--json", str(tmp_path / "run.json")]  # fmt: skip
    if where == "before":
        argv = [*flags, "--max-new-tokens", "9", "bench", *own]
    else:
        argv = ["--max-new-tokens", "9", "bench", *own, *flags]
    code, out, _ = run_main(argv, capsys)
    assert code == 0, out
    config = json.loads((tmp_path / "run.json").read_text())["config"]
    assert config["config_file"] == str(tiny_config_file)
    assert config["target"]["name"] == str(other_target)
    assert config["drafter"]["name"] == str(other_drafter)
    assert config["drafter_kind"] == "hybrid"
    assert config["gamma"] == {"policy": "heuristic", "value": 2, "confidence": 0.6}
    assert config["max_new_tokens"] == (9 if where == "before" else 5)
    assert config["processor"] == "topk(temperature=1.0, top_k=3)"
    assert config["seed"] == 11 and config["use_cache"] is False


def test_soak_and_replay_take_the_setting_flags_after_their_name(tiny_config_file: Path) -> None:
    for name in ("soak", "replay"):
        args = cli.parse_arguments(
            ["--gamma", "5", name, "--config", str(tiny_config_file), "--drafter-kind", "lookup"]
        )
        settings = app_config(args).settings
        assert (settings.gamma, settings.gamma_policy, settings.drafter_kind) == (
            5, "fixed", "lookup"
        )  # fmt: skip
