"""`python infer.py bench`: speculative decoding measured side by side with its peers.

Prompts come in Spec-Bench form (JSONL: `question_id`, `category`, `turns`; the
first turn is the prompt, chat template applied). For every prompt, in one
process on the same loaded models, after a warm-up, in an order that alternates
from one prompt to the next, the benchmark runs: specrepl target-only,
specrepl speculative (the chosen drafter kind and gamma policy), optionally a
fixed-gamma sweep of the speculative method, and with `--peers hf` what a user
would run instead: transformers `generate()` plain, with `assistant_model`
(its default settings, and with the number of drafts matched to gamma) and
with `prompt_lookup_num_tokens`. All methods get the same end tokens and token
budget. Each run is timed around the call with a clock that synchronizes the
device; new tokens are counted as tokens. Greedy runs are compared token for
token with the target-only output, and any difference is reported.

Figures are aggregated per category and overall: medians of per-prompt
figures (tokens/s, speedups as per-prompt ratios), pooled acceptance and
tokens per target step, and the speedup predicted from the same run's measured
acceptance a and cost ratios (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"):
(1 - a^(g+1)) / (1 - a) / (g*c + v), with c the drafter's seconds per drafted
token and v the seconds of a verification step, both over the target's
seconds for a one-token step of the target-only run on the same prompt. In
the formula a is the chance that a draft is accepted once the drafts before it
were, estimated as accepted / (accepted + rejections); the plain share of
drafted tokens accepted (`acceptance`, as the REPL shows it) is lower, since
drafts after a rejection are never tried.

The measuring half (`load_prompts`, `Benchmark`, `summarize`, `BenchReport`)
never prints and knows nothing about rich; `add_arguments` and `run` are the
command-line glue (progress bar, loading, exit codes) and `bench_report.py`
draws the tables and the chart.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .atomic import write_text_atomically
from .bench_markdown import run_markdown
from .compatibility import IncompatibleTokenizersError
from .config import AppConfig, ConfigError
from .devices import synchronize
from .draft_head import HeadLoadError, load_head, resolve_head
from .drafters import DRAFTER_KINDS, Drafter, DrafterOptions, build_drafter
from .flags import add_model_options, add_setting_options, app_config
from .gamma import FixedGamma, GammaPolicy, expected_tokens, make_policy
from .generation import autoregressive_generate, speculative_generate
from .models import ModelLoadError, ModelPair, load_pair
from .processors import LogitsProcessor
from .results import GenerationResult, StepEvent
from .settings import GAMMA_MAX, SettingError, Settings
from .signals import EXIT_INTERRUPTED
from .widths import WidthPlan, cpu_model, tune_pair_widths

__all__ = [
    "DRAFTER_KINDS",
    "PEERS",
    "BenchError",
    "BenchOptions",
    "BenchPrompt",
    "BenchReport",
    "Benchmark",
    "GammaSpec",
    "Method",
    "MethodRun",
    "MethodSummary",
    "Prediction",
    "PromptRecord",
    "add_arguments",
    "default_prompts_path",
    "load_prompts",
    "machine_info",
    "parse_sweep",
    "predict_from_steps",
    "predicted_speedup",
    "run",
    "summarize",
    "versions",
]

PEERS = ("hf", "hf-lookup", "none")
PROMPTS_FILE = Path("benchmarks") / "spec_bench.jsonl"
OVERALL = "overall"
WARMUP_MAX_NEW_TOKENS = 32
SCHEMA = "specrepl-bench/1"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# The method names; a sweep adds `speculative_g{N}` for each gamma N.
TARGET = "target"
SPECULATIVE = "speculative"
HF_GENERATE = "hf_generate"
HF_ASSISTED = "hf_assisted"
HF_ASSISTED_MATCHED = "hf_assisted_matched"
HF_LOOKUP = "hf_lookup"

# What a matched assistant is given (assistant_model.generation_config fields).
_ASSISTANT_FIELDS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
)

ProgressCallback = Callable[[int, int, str], None]
"""Called before each timed run with (runs done, runs in all, what runs now)."""


class BenchError(ValueError):
    """A benchmark input (prompts file, flag value, model pair) that cannot be used."""


# -- prompts ---------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    """One Spec-Bench question: its id, its category and its first turn."""

    question_id: int | str
    category: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.category}/{self.question_id}"


def default_prompts_path(
    repo_root: Path | None = None, cwd: Path | None = None
) -> tuple[Path | None, list[Path]]:
    """The Spec-Bench questions, and every place that was looked at.

    The repository ships them (`benchmarks/spec_bench.jsonl`, see
    `benchmarks/README.md`); for an installed package without the checkout,
    the same path under the working directory is looked at next.
    """
    root = repo_root or Path(__file__).resolve().parent.parent
    here = cwd or Path.cwd()
    candidates: list[Path] = [(root / PROMPTS_FILE).resolve()]
    if (here / PROMPTS_FILE).resolve() not in candidates:
        candidates.append((here / PROMPTS_FILE).resolve())
    found = next((path for path in candidates if path.is_file()), None)
    return found, candidates


def _question_id(value: Any, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BenchError(f"{where}: question_id must be an integer or a string, got {value!r}")
    return value


def load_prompts(
    path: str | Path,
    *,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[BenchPrompt]:
    """Read a Spec-Bench JSONL file; keep `categories` (all by default) and at
    most `limit` prompts per category, in file order.

    Raises BenchError naming the file and line of anything malformed, or an
    asked-for category that the file lacks.
    """
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BenchError(f"{path}: no such prompts file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"{path}: cannot read the prompts file ({exc})") from None
    if limit is not None and limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    prompts: list[BenchPrompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise BenchError(f"{where}: expected a JSON object with question_id, category, turns")
        missing = [key for key in ("question_id", "category", "turns") if key not in item]
        if missing:
            raise BenchError(f"{where}: missing {', '.join(missing)}")
        category, turns = item["category"], item["turns"]
        if not isinstance(category, str) or not category.strip():
            raise BenchError(f"{where}: category must be a non-empty string, got {category!r}")
        if (
            not isinstance(turns, list)
            or not turns
            or not isinstance(turns[0], str)
            or not turns[0].strip()
        ):
            raise BenchError(f"{where}: turns must be a list whose first item is the prompt text")
        prompts.append(
            BenchPrompt(_question_id(item["question_id"], where), category.strip(), turns[0])
        )
    if not prompts:
        raise BenchError(f"{path}: the file holds no prompts")
    available = list(dict.fromkeys(prompt.category for prompt in prompts))
    wanted = list(dict.fromkeys(categories)) if categories else available
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise BenchError(
            f"{path}: no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(unknown)}; the file has: {', '.join(available)}"
        )
    kept: list[BenchPrompt] = []
    counts = dict.fromkeys(wanted, 0)
    for prompt in prompts:
        if prompt.category in counts and (limit is None or counts[prompt.category] < limit):
            counts[prompt.category] += 1
            kept.append(prompt)
    return kept


# -- flag values -----------------------------------------------------------


@dataclass(frozen=True)
class GammaSpec:
    """A gamma policy by name with its fixed value or maximum."""

    policy: str
    gamma: int

    def build(self) -> GammaPolicy:
        return make_policy(self.policy, self.gamma)

    def describe(self) -> str:
        return str(self.gamma) if self.policy == "fixed" else f"{self.policy}≤{self.gamma}"


def parse_sweep(value: str | None) -> tuple[int, ...]:
    """`1-8`, `2,4,6` or a mix (`1-3,6`): the gammas of a sweep, sorted, no repeats."""
    if value is None or not value.strip():
        return ()
    gammas: set[int] = set()
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise BenchError(f"--gamma-sweep: expected a range like 1-8 or a list, got {value!r}")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if low > high:
            raise BenchError(f"--gamma-sweep: {low}-{high} is an empty range")
        if low < 1 or high > GAMMA_MAX:
            raise BenchError(f"--gamma-sweep: gammas must be between 1 and {GAMMA_MAX}")
        gammas.update(range(low, high + 1))
    return tuple(sorted(gammas))


def _categories(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise BenchError("--categories: give at least one category name")
    return names


# -- one run and its figures ------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One way of generating that the benchmark times.

    `settings` are what the method was given (recorded in the JSON); a
    speculative specrepl method has drafts, acceptance and a prediction.
    """

    name: str
    label: str
    family: Literal["specrepl", "hf"]
    speculative: bool = False
    sweep_gamma: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prediction:
    """The speedup over target-only expected from measured acceptance and costs.

    `alpha` is the per-draft acceptance of the formula (accepted over accepted
    plus rejections); `draft_cost` (c) and `verify_cost` (v) are in units of
    the target's one-token step; `mean_gamma` is the mean number of drafts per
    step and `tokens_per_step` the expected tokens per verification step.
    """

    alpha: float
    mean_gamma: float
    draft_cost: float
    verify_cost: float
    tokens_per_step: float
    speedup: float


def predicted_speedup(
    acceptance: float, gamma: float, draft_cost: float, verify_cost: float
) -> float:
    """(1 - a^(g+1)) / (1 - a) / (g*c + v) (Leviathan et al. 2023): expected tokens per
    verification step over its cost in one-token target steps."""
    if acceptance >= 1.0:
        tokens = gamma + 1.0
    else:
        tokens = (1.0 - acceptance ** (gamma + 1)) / (1.0 - acceptance)
    return tokens / (gamma * draft_cost + verify_cost)


def _alpha(accepted: int, rejections: int) -> float:
    """Per-draft acceptance: each step is `accepted` successes, then a failure
    unless every draft was accepted (the maximum-likelihood estimate for
    independent drafts)."""
    trials = accepted + rejections
    return accepted / trials if trials else 0.0


def predict_from_steps(
    speculative: Sequence[StepEvent], target_only: Sequence[StepEvent]
) -> Prediction | None:
    """The prediction for one speculative run from its steps and the same prompt's
    target-only steps.

    The first step of each run is left out of the costs (it processes the
    prompt). A gamma that changes from step to step (a policy) is handled per
    step: expected tokens are averaged over steps with each step's own draft
    count, which for a fixed gamma is exactly the formula above. None when
    either run has no decoding step after the first.
    """
    one_token = [event.target_seconds for event in target_only[1:]]
    steps = list(speculative[1:])
    if not one_token or not steps:
        return None
    step_seconds = statistics.fmean(one_token)
    if step_seconds <= 0:
        return None
    alpha = _alpha(
        sum(event.accepted for event in speculative),
        sum(1 for event in speculative if event.accepted < event.gamma),
    )
    drafted_later = sum(event.gamma for event in steps)
    draft_seconds = sum(event.draft_seconds for event in steps)
    draft_cost = draft_seconds / drafted_later / step_seconds if drafted_later else 0.0
    verify_cost = statistics.fmean(event.target_seconds for event in steps) / step_seconds
    mean_gamma = statistics.fmean(event.gamma for event in steps)
    tokens = statistics.fmean(expected_tokens(alpha, event.gamma) for event in steps)
    cost = mean_gamma * draft_cost + verify_cost
    if cost <= 0:
        return None
    return Prediction(
        alpha=alpha,
        mean_gamma=mean_gamma,
        draft_cost=draft_cost,
        verify_cost=verify_cost,
        tokens_per_step=tokens,
        speedup=tokens / cost,
    )


@dataclass
class MethodRun:
    """One method's run on one prompt: its tokens and the timings around it.

    `seconds` is the wall time of the whole call, read with a synchronized
    clock, the same way for every method. For specrepl runs `engine_seconds`
    is the engine's own active time and `draft_seconds`/`target_seconds`
    the time inside the drafter and the target; the rest is `other_seconds`.
    `identical` (greedy only) says whether the tokens equal the target-only
    tokens; `first_mismatch` is the first position where they differ.
    """

    method: str
    token_ids: list[int]
    seconds: float
    stop_reason: str | None = None
    engine_seconds: float | None = None
    steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    rejections: int | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
    decode_seconds: float | None = None
    decode_tokens: int | None = None
    identical: bool | None = None
    first_mismatch: int | None = None
    speedup_vs_target: float | None = None
    speedup_vs_hf: float | None = None
    draft_cost_vs_target: float | None = None
    prediction: Prediction | None = None
    events: list[StepEvent] = field(default_factory=list, repr=False)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None

    @property
    def acceptance(self) -> float | None:
        if not self.drafted or self.accepted is None:
            return None
        return self.accepted / self.drafted

    @property
    def alpha(self) -> float | None:
        """The per-draft acceptance of the prediction formula."""
        if not self.drafted or self.accepted is None or self.rejections is None:
            return None
        return _alpha(self.accepted, self.rejections)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target forward pass (the target's own token included)."""
        if self.drafted is None or not self.steps:
            return None
        return self.new_tokens / self.steps

    @property
    def other_seconds(self) -> float | None:
        """Time outside the two models' forward passes (specrepl runs only)."""
        if self.draft_seconds is None or self.target_seconds is None:
            return None
        return max(0.0, self.seconds - self.draft_seconds - self.target_seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens/s after the first step (which processes the prompt)."""
        if not self.decode_seconds or self.decode_tokens is None:
            return None
        return self.decode_tokens / self.decode_seconds

    @property
    def fallback_steps(self) -> int | None:
        """Steps where the gamma policy chose the target alone (gamma 0)."""
        if self.drafted is None:
            return None
        return sum(1 for event in self.events if event.requested_gamma == 0)

    @property
    def empty_draft_steps(self) -> int | None:
        """Steps where drafts were asked for but the drafter had none."""
        if self.drafted is None:
            return None
        return sum(1 for event in self.events if event.requested_gamma > 0 and event.gamma == 0)

    @property
    def first_drafts(self) -> tuple[int, int] | None:
        """(steps whose first draft was accepted, steps with at least one draft)."""
        if self.drafted is None:
            return None
        drafted = [event for event in self.events if event.gamma > 0]
        return sum(1 for event in drafted if event.accepted > 0), len(drafted)

    @property
    def seconds_per_draft(self) -> float | None:
        """Drafter seconds per drafted token after the first step (which also
        reads the prompt), pooled over the run."""
        later = [event for event in self.events[1:] if event.gamma > 0]
        drafted = sum(event.gamma for event in later)
        if self.drafted is None or not drafted:
            return None
        return sum(event.draft_seconds for event in later) / drafted

    @property
    def target_step_seconds(self) -> float | None:
        """Median seconds of the target's forward passes after the first step
        (for target-only decoding: the cost of one token)."""
        later = [event.target_seconds for event in self.events[1:]]
        return statistics.median(later) if later else None

    @property
    def measured_over_predicted(self) -> float | None:
        if self.prediction is None or self.speedup_vs_target is None:
            return None
        return self.speedup_vs_target / self.prediction.speedup

    @classmethod
    def from_result(
        cls, method: str, result: GenerationResult, seconds: float, events: list[StepEvent]
    ) -> MethodRun:
        speculative = result.kind == "speculative"
        first = events[0] if events else None
        return cls(
            method=method,
            token_ids=list(result.token_ids),
            seconds=seconds,
            stop_reason=result.stop_reason,
            engine_seconds=result.seconds,
            steps=result.steps,
            drafted=result.drafted if speculative else None,
            accepted=result.accepted if speculative else None,
            rejections=(
                sum(1 for event in events if event.accepted < event.gamma) if speculative else None
            ),
            draft_seconds=result.draft_seconds,
            target_seconds=result.target_seconds,
            decode_seconds=None if first is None else result.seconds - first.seconds_since_start,
            decode_tokens=None if first is None else result.new_tokens - len(first.appended),
            events=events,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "stop_reason": self.stop_reason,
            "identical_to_target": self.identical,
            "first_mismatch": self.first_mismatch,
            "speedup_vs_target": self.speedup_vs_target,
            "speedup_vs_hf_generate": self.speedup_vs_hf,
            "engine_seconds": self.engine_seconds,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejections": self.rejections,
            "acceptance": self.acceptance,
            "alpha": self.alpha,
            "mean_accepted_length": self.mean_accepted_length,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "other_seconds": self.other_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "prediction": None if self.prediction is None else asdict(self.prediction),
            "measured_over_predicted": self.measured_over_predicted,
            "first_drafts_accepted": None if self.first_drafts is None else self.first_drafts[0],
            "first_drafts": None if self.first_drafts is None else self.first_drafts[1],
            "seconds_per_draft": self.seconds_per_draft,
            "target_step_seconds": self.target_step_seconds,
            "draft_cost_vs_target": self.draft_cost_vs_target,
            "drafts_per_step": (
                [event.gamma for event in self.events] if self.drafted is not None else None
            ),
            "accepted_per_step": (
                [event.accepted for event in self.events] if self.drafted is not None else None
            ),
            "fallback_steps": self.fallback_steps,
            "empty_draft_steps": self.empty_draft_steps,
            "requested_gamma_per_step": (
                [event.requested_gamma for event in self.events]
                if self.drafted is not None
                else None
            ),
            "token_ids": list(self.token_ids),
        }


@dataclass
class PromptRecord:
    """Every method's run on one prompt, in the order they ran."""

    prompt: BenchPrompt
    prompt_tokens: int
    max_new_tokens: int
    order: list[str]
    runs: dict[str, MethodRun]
    text: str = ""
    """The target-only answer, decoded."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.prompt.question_id,
            "category": self.prompt.category,
            "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens,
            "order": list(self.order),
            "target_text": self.text,
            "methods": {name: run.to_dict() for name, run in self.runs.items()},
        }


# -- the runner ----------------------------------------------------------------


@dataclass(frozen=True)
class BenchOptions:
    """What to measure: budget, decoding rule, drafter, gamma, peers, sweep."""

    max_new_tokens: int = 128
    processor: LogitsProcessor = field(default_factory=lambda: Settings().logits_processor())
    gamma: GammaSpec = GammaSpec("fixed", 4)
    drafter_kind: str = "model"
    drafter: DrafterOptions = field(default_factory=DrafterOptions)  # order, filler, window...
    peers: tuple[str, ...] = ()
    sweep: tuple[int, ...] = ()
    seed: int = 0
    warmup: int = 1
    use_cache: bool = True
    chat: bool = True
    system_prompt: str | None = None
    tune_widths: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise BenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.drafter_kind not in DRAFTER_KINDS:
            raise BenchError(
                f"--drafter-kind must be one of {', '.join(DRAFTER_KINDS)}, "
                f"got {self.drafter_kind!r}"
            )
        unknown = [peer for peer in self.peers if peer not in PEERS]
        if unknown:
            raise BenchError(f"--peers must be one of {', '.join(PEERS)}, got {unknown[0]!r}")
        if self.warmup < 0:
            raise BenchError(f"--warmup must be >= 0, got {self.warmup}")

    @property
    def greedy(self) -> bool:
        return self.processor.is_greedy

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "processor": self.processor.describe(),
            "processor_parameters": self.processor.parameters(),
            "gamma": {"policy": self.gamma.policy, "value": self.gamma.gamma},
            "drafter_kind": self.drafter_kind,
            "drafter_options": {**asdict(self.drafter), "kind": self.drafter_kind},
            "peers": list(self.peers),
            "gamma_sweep": list(self.sweep),
            "seed": self.seed,
            "warmup_runs": self.warmup,
            "use_cache": self.use_cache,
            "chat_template": self.chat,
            "system_prompt": self.system_prompt,
            "tune_widths": self.tune_widths,
        }


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings (deprecations inside its own assisted generation)
    would break the progress bar: raise its logger to errors for the runs."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _transformers_default(name: str) -> Any:
    """transformers' built-in default of a generation option (None if unknown)."""
    from transformers import GenerationConfig

    defaults = getattr(GenerationConfig(), "_get_default_generation_params", None)
    return defaults().get(name) if callable(defaults) else None


def _first_mismatch(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    for index, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or not bottom:
        return None
    return top / bottom


class Benchmark:
    """Times every method on every prompt with one loaded pair.

    `records` grows as prompts finish, so that an interrupted benchmark still
    has everything measured until then.
    """

    def __init__(self, pair: ModelPair, options: BenchOptions) -> None:
        self.pair = pair
        self.options = options
        self.drafter = self._make_drafter()
        self.methods = self._make_methods()
        self.records: list[PromptRecord] = []
        self.skipped: list[tuple[BenchPrompt, str]] = []
        self.width_plans: dict[str, WidthPlan] = {}

    # -- set-up ------------------------------------------------------------

    def _make_drafter(self) -> Drafter:
        options = replace(self.options.drafter, kind=self.options.drafter_kind)
        if options.needs_model and self.pair.drafter is None:
            raise BenchError(
                f"--drafter-kind {options.kind} needs a drafter model, and the config loads none: "
                "add a [drafter] table or use --drafter-kind ngram or lookup"
            )
        model = self.pair.drafter.model if self.pair.drafter is not None else None
        head = None
        if options.needs_head:
            if options.head is None:
                raise BenchError(
                    f"--drafter-kind {options.kind} needs a draft head: give --drafter-head PATH "
                    "(or embedded), or a [drafter] head in the config"
                )
            try:
                head, _ = load_head(resolve_head(options.head), self.pair.target.model)
            except HeadLoadError as error:
                raise BenchError(str(error)) from None
        return build_drafter(
            options,
            model,
            head=head,
            use_cache=self.options.use_cache,
            copy_of_target=self.pair.drafter_is_copy,
        )

    def _make_methods(self) -> list[Method]:
        options = self.options
        spec = options.gamma
        kind = options.drafter_kind
        methods = [
            Method(TARGET, "specrepl target-only", "specrepl"),
            Method(
                SPECULATIVE,
                f"specrepl speculative ({kind}, γ {spec.describe()})",
                "specrepl",
                speculative=True,
                settings={"drafter_kind": kind, "gamma_policy": spec.policy, "gamma": spec.gamma},
            ),
        ]
        methods += [
            Method(
                f"{SPECULATIVE}_g{gamma}",
                f"specrepl speculative ({kind}, γ {gamma})",
                "specrepl",
                speculative=True,
                sweep_gamma=gamma,
                settings={"drafter_kind": kind, "gamma_policy": "fixed", "gamma": gamma},
            )
            for gamma in options.sweep
        ]
        if not {"hf", "hf-lookup"} & set(options.peers):
            return methods
        methods.append(Method(HF_GENERATE, "HF generate", "hf"))
        if "hf" in options.peers and self.pair.drafter is not None:
            defaults = {name: _transformers_default(name) for name in _ASSISTANT_FIELDS}
            loaded = self.pair.drafter.model.generation_config
            effective = {
                name: getattr(loaded, name, None)
                if getattr(loaded, name, None) is not None
                else defaults[name]
                for name in _ASSISTANT_FIELDS
            }
            threshold = effective["assistant_confidence_threshold"]
            stop = f", stop below {threshold}" if threshold else ""
            methods.append(
                Method(
                    HF_ASSISTED,
                    f"HF assisted (default: {effective['num_assistant_tokens']} drafts{stop})",
                    "hf",
                    settings={"assistant_generation_config": effective},
                )
            )
            methods.append(
                Method(
                    HF_ASSISTED_MATCHED,
                    f"HF assisted (γ {spec.gamma})",
                    "hf",
                    settings={"assistant_generation_config": self._matched_assistant()},
                )
            )
        methods.append(
            Method(
                HF_LOOKUP,
                f"HF prompt lookup ({spec.gamma})",
                "hf",
                settings={
                    "prompt_lookup_num_tokens": spec.gamma,
                    "max_matching_ngram_size": _transformers_default("max_matching_ngram_size"),
                },
            )
        )
        return methods

    def _matched_assistant(self) -> dict[str, Any]:
        """The assistant settings that draft as our gamma policy does: a constant
        number of drafts (the fixed gamma or the policy's maximum) and the
        policy's confidence stop (0: none)."""
        spec = self.options.gamma
        return {
            "num_assistant_tokens": spec.gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": float(spec.build().min_confidence),
        }

    @property
    def hf_options(self) -> dict[str, Any]:
        """`generate()` options shared by every HF peer: our end tokens, our
        decoding rule, no other processing."""
        eos = list(self.pair.eos_token_ids)
        pad = self.pair.tokenizer.pad_token_id
        options: dict[str, Any] = {
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else (eos[0] if eos else None),
            "use_cache": self.options.use_cache,
        }
        processor = self.options.processor
        if processor.is_greedy:
            options["do_sample"] = False
        else:
            parameters = processor.parameters()
            options.update(
                do_sample=True,
                temperature=float(parameters.get("temperature", 1.0)),
                top_k=int(parameters.get("top_k", 0)),
                top_p=float(parameters.get("top_p", 1.0)),
            )
        return options

    def prompt_ids(self, text: str) -> list[int]:
        """The prompt's token ids: the chat template when the tokenizer has one."""
        tokenizer = self.pair.tokenizer
        if self.options.chat and getattr(tokenizer, "chat_template", None):
            system = self.options.system_prompt
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": text})
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_dict=False
            )
        else:
            ids = tokenizer.encode(text)
        return [int(token) for token in ids]

    # -- timing one method ---------------------------------------------------

    def _timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        device = self.pair.device
        synchronize(device)
        start = time.perf_counter()
        value = call()
        synchronize(device)
        return value, time.perf_counter() - start

    def _specrepl(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        events: list[StepEvent] = []
        common: dict[str, Any] = {
            "logits_processor": self.options.processor,
            "max_gen_len": budget,
            "eos_tokens_id": self.pair.eos_token_ids,
            "use_cache": self.options.use_cache,
            "generator": torch.Generator(device=self.pair.device).manual_seed(seed),
            "vocab_size": self.pair.vocab_size,
            "on_step": events.append,
        }
        target = self.pair.target.model
        if not method.speculative:
            result, seconds = self._timed(lambda: autoregressive_generate(ids, target, **common))
        else:
            policy: GammaPolicy = (
                FixedGamma(method.sweep_gamma)
                if method.sweep_gamma is not None
                else self.options.gamma.build()
            )
            result, seconds = self._timed(
                lambda: speculative_generate(ids, self.drafter, target, gamma=policy, **common)
            )
        return MethodRun.from_result(method.name, result, seconds, events)

    @contextlib.contextmanager
    def _assistant_config(self, **changes: Any) -> Iterator[Any]:
        """The drafter model with `changes` to its generation config, restored
        afterwards (transformers may adapt some of them in place)."""
        if self.pair.drafter is None:
            raise BenchError("an assisted peer needs a drafter model")
        model = self.pair.drafter.model
        config = model.generation_config
        saved = {name: getattr(config, name, None) for name in _ASSISTANT_FIELDS}
        for name, value in changes.items():
            setattr(config, name, value)
        try:
            yield model
        finally:
            for name, value in saved.items():
                setattr(config, name, value)

    def _hf(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        model = self.pair.target.model
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.pair.device)
        attention_mask = torch.ones_like(input_ids)
        options = {**self.hf_options, "max_new_tokens": budget}
        changes: dict[str, Any] = {}
        if method.name == HF_LOOKUP:
            options["prompt_lookup_num_tokens"] = self.options.gamma.gamma
        elif method.name == HF_ASSISTED_MATCHED:
            changes = self._matched_assistant()
        assisted = method.name in (HF_ASSISTED, HF_ASSISTED_MATCHED)
        with self._assistant_config(**changes) if assisted else contextlib.nullcontext() as helper:
            if helper is not None:
                options["assistant_model"] = helper
            torch.manual_seed(seed)
            output, seconds = self._timed(
                lambda: model.generate(input_ids, attention_mask=attention_mask, **options)
            )
        tokens = [int(token) for token in output[0, len(ids) :].tolist()]
        ended = bool(tokens) and tokens[-1] in self.pair.eos_token_ids
        return MethodRun(
            method=method.name,
            token_ids=tokens,
            seconds=seconds,
            stop_reason="eos" if ended else "length",
        )

    def run_method(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        """Time one method on one prompt's ids with a budget of new tokens."""
        if method.family == "specrepl":
            return self._specrepl(method, ids, budget, seed)
        return self._hf(method, ids, budget, seed)

    # -- the whole benchmark --------------------------------------------------

    def budget(self, prompt_tokens: int) -> int:
        """New tokens every method may make: the limit, or what the context leaves."""
        return min(self.options.max_new_tokens, self.pair.context_length - prompt_tokens)

    def max_gamma(self) -> int:
        return max((self.options.gamma.gamma, *self.options.sweep))

    def total_runs(self, prompts: Sequence[BenchPrompt]) -> int:
        warmups = self.options.warmup * len(self.methods) if prompts else 0
        return warmups + len(prompts) * len(self.methods)

    def warm_up(
        self, prompt: BenchPrompt, on_progress: ProgressCallback | None = None, *, total: int = 0
    ) -> int:
        """Run every method `options.warmup` times on `prompt` (short, not recorded)."""
        ids = self.prompt_ids(prompt.text)
        budget = min(self.budget(len(ids)), WARMUP_MAX_NEW_TOKENS)
        done = 0
        if budget < 1:
            return done
        for _ in range(self.options.warmup):
            for method in self.methods:
                if on_progress is not None:
                    on_progress(done, total, f"warm-up · {method.label}")
                self.run_method(method, ids, budget, self.options.seed)
                done += 1
        return done

    def measure(
        self,
        prompt: BenchPrompt,
        index: int,
        on_progress: ProgressCallback | None = None,
        *,
        done: int = 0,
        total: int = 0,
    ) -> PromptRecord | None:
        """Run every method on one prompt (order reversed on odd `index`);
        None when the prompt leaves no room for a new token."""
        ids = self.prompt_ids(prompt.text)
        budget = self.budget(len(ids))
        if budget < 1:
            self.skipped.append(
                (
                    prompt,
                    f"{len(ids)} prompt tokens fill the {self.pair.context_length}-token context",
                )
            )
            return None
        order = self.methods if index % 2 == 0 else self.methods[::-1]
        seed = self.options.seed + index
        runs: dict[str, MethodRun] = {}
        for step, method in enumerate(order):
            if on_progress is not None:
                on_progress(done + step, total, f"{prompt.key} · {method.label}")
            runs[method.name] = self.run_method(method, ids, budget, seed)
        self._compare(runs)
        record = PromptRecord(
            prompt=prompt,
            prompt_tokens=len(ids),
            max_new_tokens=budget,
            order=[method.name for method in order],
            runs={method.name: runs[method.name] for method in self.methods},
            text=self.pair.tokenizer.decode(runs[TARGET].token_ids, skip_special_tokens=True),
        )
        self.records.append(record)
        return record

    def _compare(self, runs: dict[str, MethodRun]) -> None:
        """Identity with target-only (greedy), per-prompt speedups, predictions."""
        target = runs[TARGET]
        hf = runs.get(HF_GENERATE)
        for name, run in runs.items():
            if self.options.greedy and name != TARGET:
                run.first_mismatch = _first_mismatch(run.token_ids, target.token_ids)
                run.identical = run.first_mismatch is None
            run.speedup_vs_target = _ratio(run.tokens_per_second, target.tokens_per_second)
            if hf is not None:
                run.speedup_vs_hf = _ratio(run.tokens_per_second, hf.tokens_per_second)
            if run.drafted is not None:
                run.prediction = predict_from_steps(run.events, target.events)
                run.draft_cost_vs_target = _ratio(run.seconds_per_draft, target.target_step_seconds)

    def run(
        self, prompts: Sequence[BenchPrompt], on_progress: ProgressCallback | None = None
    ) -> list[PromptRecord]:
        """Warm up on the first prompt, then measure every prompt in turn."""
        total = self.total_runs(prompts)
        if not prompts:
            return self.records
        with _quiet_transformers(), torch.no_grad():
            if self.options.tune_widths:
                if on_progress is not None:
                    on_progress(0, total, "timing forward widths")
                self.width_plans = tune_pair_widths(self.pair, self.max_gamma())
            self.warm_up(prompts[0], on_progress, total=total)
            done = self.options.warmup * len(self.methods)
            for index, prompt in enumerate(prompts):
                self.measure(prompt, index, on_progress, done=done, total=total)
                done += len(self.methods)
        if on_progress is not None:
            on_progress(total, total, "done")
        return self.records


# -- aggregation ----------------------------------------------------------------


@dataclass(frozen=True)
class MethodSummary:
    """One method's figures over a set of prompts.

    Tokens/s, speedups, predictions and measured/predicted are medians of the
    per-prompt figures; acceptance (accepted / drafted), alpha (accepted /
    (accepted + rejections)) and tokens per step are pooled (sums over the
    prompts); the time shares are pooled over specrepl runs.
    `identical` counts the prompts whose tokens equal target-only's, out of
    `compared` (greedy runs only).
    """

    method: str
    prompts: int
    tokens_per_second: float | None
    speedup_vs_target: float | None
    speedup_vs_hf: float | None
    acceptance: float | None
    alpha: float | None
    mean_accepted_length: float | None
    predicted_speedup: float | None
    measured_over_predicted: float | None
    identical: int
    compared: int
    draft_share: float | None
    target_share: float | None
    other_share: float | None
    fallback_share: float | None = None
    """Pooled share of steps where the policy chose the target alone."""
    empty_draft_share: float | None = None
    """Pooled share of steps where the drafter had nothing to propose."""
    first_draft_acceptance: float | None = None
    """Pooled share of drafting steps whose first draft was accepted."""
    draft_cost_vs_target: float | None = None
    """Median over prompts of (drafter seconds per drafted token) / (seconds of
    one target-only forward pass)."""


def _median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None and math.isfinite(value)]
    return statistics.median(present) if present else None


def _summary(method: str, runs: list[MethodRun]) -> MethodSummary:
    drafted = sum(run.drafted or 0 for run in runs)
    accepted = sum(run.accepted or 0 for run in runs)
    rejections = sum(run.rejections or 0 for run in runs)
    speculative = any(run.drafted is not None for run in runs)
    steps = sum(run.steps or 0 for run in runs)
    timed = [run for run in runs if run.draft_seconds is not None]
    seconds = sum(run.seconds for run in timed)

    def share(part: Callable[[MethodRun], float | None]) -> float | None:
        if not timed or seconds <= 0:
            return None
        return sum(part(run) or 0.0 for run in timed) / seconds

    compared = [run for run in runs if run.identical is not None]
    firsts = [run.first_drafts for run in runs if run.first_drafts is not None]
    first_taken = sum(taken for taken, _ in firsts)
    first_tried = sum(tried for _, tried in firsts)
    return MethodSummary(
        method=method,
        prompts=len(runs),
        tokens_per_second=_median(run.tokens_per_second for run in runs),
        speedup_vs_target=_median(run.speedup_vs_target for run in runs),
        speedup_vs_hf=_median(run.speedup_vs_hf for run in runs),
        acceptance=accepted / drafted if drafted else None,
        alpha=_alpha(accepted, rejections) if drafted else None,
        mean_accepted_length=(
            sum(run.new_tokens for run in runs) / steps if speculative and steps else None
        ),
        predicted_speedup=_median(
            run.prediction.speedup if run.prediction is not None else None for run in runs
        ),
        measured_over_predicted=_median(run.measured_over_predicted for run in runs),
        identical=sum(1 for run in compared if run.identical),
        compared=len(compared),
        draft_share=share(lambda run: run.draft_seconds),
        target_share=share(lambda run: run.target_seconds),
        other_share=share(lambda run: run.other_seconds),
        fallback_share=(
            sum(run.fallback_steps or 0 for run in runs) / steps if speculative and steps else None
        ),
        empty_draft_share=(
            sum(run.empty_draft_steps or 0 for run in runs) / steps
            if speculative and steps
            else None
        ),
        first_draft_acceptance=first_taken / first_tried if first_tried else None,
        draft_cost_vs_target=_median(run.draft_cost_vs_target for run in runs),
    )


def summarize(
    records: Sequence[PromptRecord], methods: Sequence[Method]
) -> dict[str, dict[str, MethodSummary]]:
    """Figures per category (in the order first met) and `overall`, per method."""
    groups: dict[str, list[PromptRecord]] = {}
    for record in records:
        groups.setdefault(record.prompt.category, []).append(record)
    if records:
        groups[OVERALL] = list(records)
    return {
        category: {
            method.name: _summary(
                method.name,
                [record.runs[method.name] for record in members if method.name in record.runs],
            )
            for method in methods
        }
        for category, members in groups.items()
    }


# -- the report ---------------------------------------------------------------


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
        "cpu": cpu_model(),
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
    import transformers

    from . import __version__

    return {
        "specrepl": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
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
    skipped: list[tuple[BenchPrompt, str]] = field(default_factory=list)
    interrupted: bool = False

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
            skipped=list(benchmark.skipped),
            interrupted=interrupted,
        )

    @property
    def has_hf(self) -> bool:
        return any(method.name == HF_GENERATE for method in self.methods)

    @property
    def main_methods(self) -> list[Method]:
        """The methods without the sweep's."""
        return [method for method in self.methods if method.sweep_gamma is None]

    @property
    def sweep_methods(self) -> list[Method]:
        return [method for method in self.methods if method.sweep_gamma is not None]

    def mismatches(self) -> list[tuple[PromptRecord, MethodRun]]:
        """Greedy runs whose tokens differ from target-only's."""
        return [
            (record, run)
            for record in self.records
            for run in record.runs.values()
            if run.identical is False
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
            "summary": {
                category: {name: asdict(summary) for name, summary in methods.items()}
                for category, methods in self.summary.items()
            },
            "gamma_sweep": [
                {"gamma": method.sweep_gamma, **asdict(overall[method.name])}
                for method in self.sweep_methods
                if method.name in overall
            ],
            "skipped": [
                {"question_id": prompt.question_id, "category": prompt.category, "reason": reason}
                for prompt, reason in self.skipped
            ],
            "prompts": [record.to_dict() for record in self.records],
        }

    def write_json(self, path: str | Path) -> Path:
        out = Path(path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        return out


# -- the command line -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py bench`: its own, and the model and setting flags
    every entry point takes (flags.py), which mean the same before or after `bench`."""
    parser.add_argument(
        "--prompts",
        metavar="PATH",
        help="Spec-Bench JSONL (question_id, category, turns); default: "
        f"{PROMPTS_FILE.as_posix()}, shipped with specrepl",
    )
    parser.add_argument("--limit", type=int, metavar="N", help="at most N prompts per category")
    parser.add_argument(
        "--categories", metavar="A,B", help="only these categories (comma-separated)"
    )
    parser.add_argument(
        "--peers",
        choices=PEERS,
        help="hf: also time transformers generate() and its drafters; "
        "hf-lookup: generate() and its prompt lookup only",
    )
    parser.add_argument(
        "--gamma-sweep",
        metavar="RANGE",
        help="also run the speculative method with each fixed gamma, e.g. 1-8",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure here")
    parser.add_argument(
        "--format",
        choices=("table", "markdown"),
        default="table",
        help="the report on stdout: tables (default), or Markdown to paste into an issue or"
        " README (progress then goes to stderr); `python infer.py compare` prints saved runs",
    )
    parser.add_argument(
        "--chart", dest="chart_out", metavar="OUT.png", help="draw speedups here (matplotlib)"
    )
    parser.add_argument(
        "--warmup", type=int, metavar="N", default=1, help="warm-up runs of every method (1)"
    )
    parser.add_argument(
        "--widths",
        choices=("tune", "off"),
        default="tune",
        help="tune: time each model's forward widths first and pad to cheaper ones (default)",
    )
    add_model_options(parser, after_subcommand=True)
    add_setting_options(parser, after_subcommand=True)


def _arg(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


@dataclass(frozen=True)
class _Plan:
    config: AppConfig
    prompts_path: Path
    prompts: list[BenchPrompt]
    options: BenchOptions
    load_drafter: bool

    def config_dict(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            "config_file": None if self.config.path is None else str(self.config.path),
            "device": self.config.device,
            "prompts_file": str(self.prompts_path),
            "categories": list(dict.fromkeys(prompt.category for prompt in self.prompts)),
            "limit_per_category": _arg(args, "limit"),
            "prompts": len(self.prompts),
        }


def _plan(args: argparse.Namespace) -> _Plan:
    """Everything the flags and the config decide, checked before any model loads."""
    config = app_config(args)
    settings = config.settings
    if _arg(args, "prompts"):
        prompts_path = Path(_arg(args, "prompts")).expanduser()
    else:
        found, looked = default_prompts_path()
        if found is None:
            raise BenchError(
                "no prompts file: looked for "
                + ", ".join(str(path) for path in looked)
                + "; give one with --prompts PATH"
            )
        prompts_path = found
    prompts = load_prompts(
        prompts_path, categories=_categories(_arg(args, "categories")), limit=_arg(args, "limit")
    )
    peers = () if _arg(args, "peers") in (None, "none") else (_arg(args, "peers"),)
    options = BenchOptions(
        max_new_tokens=settings.max_new_tokens,
        processor=settings.logits_processor(),
        gamma=GammaSpec(settings.gamma_policy, settings.gamma),
        drafter_kind=settings.drafter_kind,
        drafter=settings.drafter_options(),
        peers=peers,
        sweep=parse_sweep(_arg(args, "gamma_sweep")),
        seed=settings.seed,
        warmup=1 if _arg(args, "warmup") is None else _arg(args, "warmup"),
        use_cache=settings.use_cache,
        chat=settings.chat,
        system_prompt=settings.system_prompt,
        tune_widths=_arg(args, "widths") != "off",
    )
    needs_model = settings.drafter_options().needs_model
    if needs_model and config.drafter is None:
        raise BenchError(
            f"--drafter-kind {settings.drafter_kind} needs a drafter model, and the config has"
            " none (or --drafter none was given): use --drafter-kind ngram, lookup or head"
        )
    return _Plan(config, prompts_path, prompts, options, needs_model or bool(peers))


def _progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def run(args: argparse.Namespace, console: Console, *, pair: ModelPair | None = None) -> int:
    """`python infer.py bench`: measure, show the tables, write JSON and chart.

    `pair` replaces loading the config's models (tests). Returns the exit
    status: 0, 1 (models could not be loaded), 2 (bad input) or 130 (Ctrl-C;
    what was measured is still shown and written).
    """
    from . import bench_report

    markdown = _arg(args, "format") == "markdown"
    report_console = console
    if markdown:  # stdout is the Markdown alone; everything else goes to stderr
        console = Console(stderr=True, highlight=False)

    def fail(message: str, status: int) -> int:
        console.print(f"[bold red]error:[/] {escape(message)}")
        return status

    try:
        plan = _plan(args)
    except (BenchError, ConfigError, SettingError, ValueError) as error:
        return fail(str(error), EXIT_USAGE)
    chart_out = _arg(args, "chart_out")
    if chart_out:
        missing = bench_report.chart_unavailable()
        if missing is not None:
            return fail(f"--chart: {missing}", EXIT_USAGE)
    if pair is None:
        config = plan.config
        try:
            with console.status("loading models…") as status:
                pair = load_pair(
                    config.target,
                    config.drafter if plan.load_drafter else None,
                    device=config.device,
                    trust_remote_code=config.trust_remote_code,
                    progress=lambda message: status.update(escape(message)),
                )
        except (ModelLoadError, IncompatibleTokenizersError) as error:
            return fail(str(error), EXIT_FAILED)
        except KeyboardInterrupt:
            return fail("interrupted while loading the models", EXIT_INTERRUPTED)
    try:
        benchmark = Benchmark(pair, plan.options)
    except BenchError as error:
        return fail(str(error), EXIT_USAGE)
    console.print(
        f"[bold]bench[/] {len(plan.prompts)} prompts × {len(benchmark.methods)} methods, "
        f"{plan.options.max_new_tokens} new tokens, {escape(plan.options.processor.describe())}, "
        f"{torch.get_num_threads()} threads, on {pair.device}"
    )
    interrupted = False
    with _progress_bar(console) as progress:
        task = progress.add_task("warm-up", total=benchmark.total_runs(plan.prompts))

        def on_progress(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=escape(description))

        try:
            benchmark.run(plan.prompts, on_progress)
        except KeyboardInterrupt:
            interrupted = True
    report = BenchReport.build(benchmark, config=plan.config_dict(args), interrupted=interrupted)
    if markdown:
        report_console.file.write(run_markdown(report.to_dict()))
        report_console.file.flush()
    else:
        bench_report.render_report(report, report_console)
    json_out = _arg(args, "json_out")
    if json_out:
        try:
            console.print(f"wrote {escape(str(report.write_json(json_out)))}")
        except OSError as error:
            return fail(f"--json: cannot write {json_out}: {error}", EXIT_FAILED)
    if chart_out and report.records:
        try:
            console.print(f"wrote {escape(str(bench_report.write_chart(report, chart_out)))}")
        except OSError as error:
            return fail(f"--chart: cannot write {chart_out}: {error}", EXIT_FAILED)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK
