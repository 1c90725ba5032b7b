"""Results people can read and share: reports written to a file or a pipe keep
every cell whole, and `bench --format markdown` and `compare` print Markdown
tables (specrepl/bench/markdown.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrepl.app import cli
from specrepl.measure.bench.markdown import compare_markdown, load_run, markdown_table, run_markdown

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    '{"question_id": 1, "category": "qa", "turns": ["w7 w8 w9"]}\n'
    '{"question_id": 2, "category": "math", "turns": ["w10 w11 w10 w11"]}\n'
)


def tables(markdown: str) -> list[list[list[str]]]:
    """Every Markdown table in `markdown`: its rows of cells, header first. Asserts
    each has a separator row under its header and as many cells in every row."""
    found: list[list[list[str]]] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        if not lines[index].startswith("|"):
            index += 1
            continue
        block = []
        while index < len(lines) and lines[index].startswith("|"):
            block.append(lines[index])
            index += 1
        rows = [[cell.strip() for cell in line.strip()[1:-1].split(" | ")] for line in block]
        assert len(rows) >= 2 and all(set(cell) <= set("-:") for cell in rows[1]), block
        assert all(len(row) == len(rows[0]) for row in rows), block
        found.append([rows[0], *rows[2:]])
    return found


def child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    return {**env, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def bench_run(tiny_config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One bench on the tiny pair with a gamma sweep, stdout into a pipe: the JSON
    and what was printed."""
    root = tmp_path_factory.mktemp("bench")
    prompts = root / "prompts.jsonl"
    prompts.write_text(PROMPTS)
    out = root / "run.json"
    completed = subprocess.run(
        [
            sys.executable, "infer.py", "bench", "--config", str(tiny_config_file),
            "--prompts", str(prompts), "--max-new-tokens", "6", "--gamma", "3",
            "--gamma-sweep", "2,4", "--warmup", "0", "--json", str(out),
        ],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return out, completed.stdout


def test_a_bench_report_in_a_pipe_cuts_no_cell(bench_run: tuple[Path, str]) -> None:
    path, printed = bench_run
    assert "…" not in printed
    labels = [method["label"] for method in load_run(path)["methods"]]
    for label in labels:
        if "γ 2" not in label and "γ 4" not in label:  # the sweep's rows show γ alone
            assert label in printed, label
    for header in ("tok/s", "× target", "accept", "predicted", "meas/pred", "draft ÷ target"):
        assert header in printed


def test_a_one_shot_answer_in_a_pipe_cuts_no_cell(tiny_config_file: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "infer.py", "--config", str(tiny_config_file), "--prompt", "w7 w8",
         "--drafter-gen"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "…" not in completed.stdout
    for header in ("generator", "tokens", "fed", "TTFT", "accept", "tok/step", "speedup", "stop"):
        assert header in completed.stdout


def test_the_markdown_of_a_run_has_a_row_per_method(bench_run: tuple[Path, str]) -> None:
    path, _ = bench_run
    run = load_run(path)
    markdown = run_markdown(run)
    overall, by_category, time_split, sweep, per_prompt = tables(markdown)
    main = [m["label"] for m in run["methods"] if m["sweep_gamma"] is None]
    assert [row[0] for row in overall[1:]] == main
    assert overall[0][:3] == ["method", "tok/s", "× target"]
    assert by_category[0] == ["method", "qa", "math", "overall"]
    assert [row[0] for row in by_category[1:]] == main
    assert [row[0] for row in time_split[1:]] == [label for label in main if "target" not in label]
    assert [row[0] for row in sweep[1:]] == ["2", "4"]
    assert per_prompt[0] == ["prompt", "turn", "fed/prompt", "× target", "speculative vs target"]
    assert [row[:2] for row in per_prompt[1:]] == [["qa/1", "first"], ["math/2", "first"]]
    assert all(row[-1] == "identical" for row in per_prompt[1:])  # greedy
    assert "<details><summary>Per prompt" in markdown
    figures = run["summary"]["overall"]["speculative"]
    row = next(row for row in overall[1:] if row[0] == main[1])
    assert row[1] == f"{figures['tokens_per_second']:.1f}"
    assert row[2] == f"{figures['speedup_vs_target']:.2f}×"
    assert "AMD" in markdown or "Intel" in markdown or run["machine"]["cpu"] in markdown
    assert "Command: `python infer.py bench" in markdown


def test_bench_format_markdown_prints_markdown_alone(
    tiny_config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(PROMPTS)
    code = cli.main(
        [
            "bench", "--config", str(tiny_config_file), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--warmup", "0", "--format", "markdown",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("Machine: ")
    assert "bench 2 prompts" in captured.err  # progress and notes go to stderr
    overall = tables(captured.out)[0]
    assert [row[0] for row in overall[1:]] == [
        "specrepl target-only",
        "specrepl speculative (model, γ 4)",
    ]


def test_compare_puts_runs_side_by_side(
    bench_run: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = bench_run
    other = json.loads(path.read_text())
    other["machine"]["cpu"] = "Another CPU"
    other["summary"]["overall"]["speculative"]["speedup_vs_target"] = 1.5
    second = tmp_path / "after.json"
    second.write_text(json.dumps(other))
    assert cli.main(["compare", str(path), str(second)]) == 0
    printed = capsys.readouterr().out
    runs = tables(printed)[0]
    assert runs[0] == ["", "run", "after"]
    assert [row[0] for row in runs[1:]] == ["machine", "versions", "date", "command", "prompts"]
    assert "Another CPU" in runs[1][2] and "Another CPU" not in runs[1][1]
    speedups = tables(printed.split("**× target** (overall)", 1)[1])[0]
    assert speedups[0] == ["method", "run", "after"]
    spec = next(row for row in speedups[1:] if row[0].startswith("specrepl speculative"))
    assert spec[2] == "1.50×" and spec[1] != "1.50×"
    by_category = tables(printed.split("× specrepl target-only by category**", 1)[1])[0]
    assert [row[0] for row in by_category[1:]] == ["qa", "math", "overall"]
    assert compare_markdown([load_run(path)], ["one"]).count("| one |") >= 1


def test_compare_refuses_a_file_that_is_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"schema": "something else"}')
    assert cli.main(["compare", str(bad)]) == 2
    assert "not a `bench --json` file" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_markdown_cell_stays_in_its_cell() -> None:
    text = markdown_table(["method", "x"], [["a | b\nc", 1.5]])
    assert text.splitlines()[2] == "| a \\| b c | 1.5 |"
