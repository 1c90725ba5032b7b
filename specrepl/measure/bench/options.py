"""What one benchmark measures: the session's `Settings` and bench's own few choices.

Everything the REPL also has (token budget, decoding rule, drafter kind and
options, gamma policy, seed, cache, chat template, system prompt) is the
`Settings` the REPL runs with, with its defaults, so `bench` measures what a
user runs. `BenchOptions` adds only what is bench's own: the peers, the gamma
sweep, warm-up runs, width tuning, the compiled peer's backend, `--chat` and
the long-input threshold; and `to_dict` writes both to the JSON's `config`.

Reads no model: the processor is built from the settings when asked for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from specrepl.chat.settings import Settings
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.measure.bench.figures import LONG_INPUT_TOKENS
from specrepl.measure.bench.prompts import BenchError

if TYPE_CHECKING:
    from specrepl.engine.processors import LogitsProcessor

__all__ = ["DEFAULT_PEERS", "PEERS", "BenchOptions"]

PEERS = ("hf", "hf-lookup", "hf-compiled", "llamacpp", "llamacpp-exact", "none")
DEFAULT_PEERS = ("llamacpp-exact",)
"""The fastest plain run of the target's own weights, in every run unless --peers says."""


@dataclass(frozen=True)
class BenchOptions:
    """What to measure: the session's settings, then bench's own choices."""

    settings: Settings = field(default_factory=Settings)
    """Budget, decoding rule, drafter, gamma, seed, cache, chat: as the REPL runs them."""
    peers: tuple[str, ...] = ()
    sweep: tuple[int, ...] = ()
    warmup: int = 1
    tune_widths: bool = True
    compile_backend: str = "inductor"
    """torch.compile's backend for the hf-compiled peer."""
    conversation: bool = False
    """`--chat`: every prompt of the file is a turn of one chat, caches kept between turns."""
    long_input_tokens: int = LONG_INPUT_TOKENS
    """A turn whose prompt has at least this many tokens counts as a long input."""

    def __post_init__(self) -> None:
        unknown = [peer for peer in self.peers if peer not in PEERS]
        if unknown:
            raise BenchError(f"--peers must be one of {', '.join(PEERS)}, got {unknown[0]!r}")
        if self.warmup < 0:
            raise BenchError(f"--warmup must be >= 0, got {self.warmup}")
        if self.long_input_tokens < 1:
            raise BenchError(f"--long-input must be >= 1, got {self.long_input_tokens}")

    @property
    def processor(self) -> LogitsProcessor:
        """The decoding rule the settings ask for."""
        return self.settings.logits_processor()

    @property
    def greedy(self) -> bool:
        return self.processor.is_greedy

    @property
    def drafter(self) -> DrafterOptions:
        """The drafter the settings ask for, its kind included."""
        return self.settings.drafter_options()

    def to_dict(self) -> dict[str, Any]:
        settings = self.settings
        processor = self.processor
        return {
            "max_new_tokens": settings.max_new_tokens,
            "processor": processor.describe(),
            "processor_parameters": processor.parameters(),
            "gamma": {
                "policy": settings.gamma_policy,
                "value": settings.gamma,
                "confidence": settings.confidence,
            },
            "drafter_kind": settings.drafter_kind,
            "drafter_options": asdict(self.drafter),
            "peers": list(self.peers),
            "gamma_sweep": list(self.sweep),
            "seed": settings.seed,
            "warmup_runs": self.warmup,
            "use_cache": settings.use_cache,
            "chat_template": settings.chat,
            "system_prompt": settings.system_prompt,
            "tune_widths": self.tune_widths,
            "compile_backend": self.compile_backend,
            "conversation": self.conversation,
            "long_input_tokens": self.long_input_tokens,
        }
