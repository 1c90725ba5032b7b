"""A finished benchmark as one object: its runs, summaries, machine and settings, and its JSON.

`BenchReport.build` gathers what a `Benchmark` measured with the machine it ran
on (`machine_info`: CPU model, cores, threads, memory, GPU) and the versions;
`to_dict` is the `bench --json` file (schema `specrepl-bench/1`), which
`compare` and the Markdown tables read back: the summary per category and
overall, the summary per kind of turn (`summary_by_turn`: first turns, later
turns, long inputs), and every prompt's runs, each with its verdict against
target-only's tokens. No rich here.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from specrepl.engine.widths import cpu_identity
from specrepl.measure.bench.figures import (
    HF_GENERATE,
    LLAMACPP_ALONE,
    Method,
    MethodRun,
    PromptRecord,
)
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.prompts import BenchTurn
from specrepl.measure.bench.runner import Benchmark
from specrepl.measure.bench.summary import (
    OVERALL,
    MethodSummary,
    OverCategories,
    over_llamacpp_by_category,
    summarize,
    summarize_turns,
)
from specrepl.store.atomic import write_text_atomically
from specrepl.version import __version__

__all__ = ["SCHEMA", "BenchReport", "machine_info", "versions"]

SCHEMA = "specrepl-bench/1"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info(device: torch.device) -> dict[str, Any]:
    """The CPU model, core and thread counts, memory, the GPU used (if one is)
    and every CUDA GPU present."""
    gpu = None
    gpus: list[str] = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        if device.type == "cuda":
            gpu = torch.cuda.get_device_name(device)
    if device.type == "mps":
        gpu = "Apple MPS"
    return {
        "cpu": cpu_identity(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": _memory_gib(),
        "device": str(device),
        "gpu": gpu,
        "gpus_present": gpus,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    return {
        "specrepl": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _summaries(groups: dict[str, dict[str, MethodSummary]]) -> dict[str, Any]:
    """Summaries per group and method as JSON."""
    return {
        group: {name: asdict(summary) for name, summary in methods.items()}
        for group, methods in groups.items()
    }


@dataclass
class BenchReport:
    """Everything one benchmark produced, ready for the tables, the chart and JSON."""

    methods: list[Method]
    records: list[PromptRecord]
    summary: dict[str, dict[str, MethodSummary]]
    options: BenchOptions
    machine: dict[str, Any]
    versions: dict[str, str]
    config: dict[str, Any]
    created: str
    turn_summary: dict[str, dict[str, MethodSummary]] = field(default_factory=dict)
    """Figures per kind of turn (`figures.TURN_GROUPS`), per method."""
    skipped: list[tuple[BenchTurn, str]] = field(default_factory=list)
    interrupted: bool = False
    unavailable: dict[str, str] = field(default_factory=dict)
    """Peers asked for that could not run here, with the reason."""
    compile_seconds: float | None = None
    """The hf-compiled peer's first call, compilation included."""

    @classmethod
    def build(
        cls,
        benchmark: Benchmark,
        *,
        config: dict[str, Any] | None = None,
        interrupted: bool = False,
    ) -> BenchReport:
        pair = benchmark.pair
        return cls(
            methods=list(benchmark.methods),
            records=list(benchmark.records),
            summary=summarize(benchmark.records, benchmark.methods),
            options=benchmark.options,
            machine=machine_info(pair.device),
            versions=versions(),
            config={
                **(config or {}),
                **benchmark.options.to_dict(),
                "target": pair.target.to_dict(),
                "drafter": pair.drafter.to_dict() if pair.drafter else None,
                "eos_token_ids": list(pair.eos_token_ids),
                "vocab_size": pair.vocab_size,
                "width_plans": {
                    role: plan.to_dict() for role, plan in benchmark.width_plans.items()
                },
            },
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            turn_summary=summarize_turns(benchmark.records, benchmark.methods),
            skipped=list(benchmark.skipped),
            interrupted=interrupted,
            unavailable=dict(benchmark.unavailable),
            compile_seconds=benchmark.compile_seconds,
        )

    @property
    def has_hf(self) -> bool:
        return any(method.name == HF_GENERATE for method in self.methods)

    @property
    def has_llamacpp_alone(self) -> bool:
        """Whether llama.cpp alone on the target's exact weights ran."""
        return any(method.name in LLAMACPP_ALONE for method in self.methods)

    def over_llamacpp(self) -> dict[str, OverCategories]:
        """Each main method's speedup over llama.cpp alone across categories."""
        figures = {
            method.name: over_llamacpp_by_category(self.summary, method.name)
            for method in self.main_methods
            if method.name not in LLAMACPP_ALONE
        }
        return {name: over for name, over in figures.items() if over is not None}

    @property
    def main_methods(self) -> list[Method]:
        """The methods without the sweep's."""
        return [method for method in self.methods if method.sweep_gamma is None]

    @property
    def sweep_methods(self) -> list[Method]:
        return [method for method in self.methods if method.sweep_gamma is not None]

    def mismatches(self) -> list[tuple[PromptRecord, MethodRun]]:
        """Greedy runs whose tokens differ from target-only's, among the methods
        that compute as specrepl does (llama.cpp's quantized arithmetic is
        expected to part from it)."""
        same_arithmetic = {m.name for m in self.methods if m.family != "llamacpp"}
        return [
            (record, run)
            for record in self.records
            for run in record.runs.values()
            if run.identical is False and run.method in same_arithmetic
        ]

    def to_dict(self) -> dict[str, Any]:
        overall = self.summary.get(OVERALL, {})
        return {
            "schema": SCHEMA,
            "created": self.created,
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "interrupted": self.interrupted,
            "machine": self.machine,
            "versions": self.versions,
            "config": self.config,
            "methods": [
                {
                    "name": method.name,
                    "label": method.label,
                    "family": method.family,
                    "speculative": method.speculative,
                    "sweep_gamma": method.sweep_gamma,
                    "settings": method.settings,
                }
                for method in self.methods
            ],
            "summary": _summaries(self.summary),
            "over_llamacpp_alone": {
                name: asdict(over) for name, over in self.over_llamacpp().items()
            },
            "summary_by_turn": _summaries(self.turn_summary),
            "gamma_sweep": [
                {"gamma": method.sweep_gamma, **asdict(overall[method.name])}
                for method in self.sweep_methods
                if method.name in overall
            ],
            "unavailable": dict(self.unavailable),
            "compile_seconds": self.compile_seconds,
            "skipped": [
                {
                    "key": turn.key,
                    "question_id": turn.question_id,
                    "category": turn.category,
                    "turn": turn.number,
                    "reason": reason,
                }
                for turn, reason in self.skipped
            ],
            "prompts": [record.to_dict() for record in self.records],
        }

    def write_json(self, path: str | Path) -> Path:
        out = Path(path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        return out
