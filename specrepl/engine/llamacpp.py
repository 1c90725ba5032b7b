"""llama.cpp through llama-cpp-python: whether it is here, and opening a GGUF file with it.

Two parts of specrepl run a model's GGUF file in llama.cpp: the llama.cpp
drafter (`drafters/llamacpp.py`, chosen in `drafters/runtime.py`: the drafter
model's own file, with 4-bit kernels a CPU runs far faster than torch's float32
or bfloat16) and bench's llama.cpp peer (`measure/bench/llamacpp.py`). Both
open it here.

llama-cpp-python has no wheel on PyPI: `bash scripts/setup.sh` compiles it
(several minutes; a build that fails leaves specrepl working without it).
`open_gguf` raises `LlamaCppUnavailable` with the reason (not installed, no
GGUF file, does not import or load), so that callers can say why and go on
without it. With `sequences=2` its context holds a second, scratch sequence
in the same cache (`with_sequences`): the drafter writes the target's keys
and values for new positions there and joins them to its own sequence
(`drafters/llamacpp_kv.py`), where llama.cpp's sequence-state call would
otherwise replace the whole sequence.

A native library can do what no Python exception reports: a build of
llama.cpp 0.3.36 crashed with a segmentation fault in `llama_decode` on a
2-core Intel Xeon with AMX, which would end the whole session. So before a
file is opened in this process for the first time, `trial_problem` runs it in
a child process (load, a prompt batch, single steps, a rollback, a state
written into a scratch sequence) and only a clean run lets it in. The verdict
is kept per binding build, CPU, file and trial in
`<cache>/llamacpp-trials.json` (`python infer.py cache clear llamacpp` forgets
it), so the ~1 s trial runs once per machine, not at every start.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from specrepl.store.json_file import read_json_object, write_json_object
from specrepl.store.paths import fingerprint, llamacpp_trials_file

__all__ = [
    "INSTALL_HINT",
    "LlamaCppUnavailable",
    "build_identity",
    "import_llamacpp",
    "open_gguf",
    "sequences",
    "trial_problem",
    "with_sequences",
]

INSTALL_HINT = "bash scripts/setup.sh builds it"
TRIAL_SECONDS = 120.0
"""A trial that has not ended by then is taken as failed (not stored: a busy
machine may be the cause)."""

# Run in a child process: load the file, read a prompt in one batch, decode
# single tokens, cut the cache back and decode again, as the drafter does.
_TRIAL = """
import sys
import llama_cpp
path, threads = sys.argv[1], int(sys.argv[2])
llama = llama_cpp.Llama(model_path=path, n_ctx=128, n_threads=threads,
                        n_threads_batch=threads, verbose=False)
prompt = llama.tokenize(b"The quick brown fox jumps over the lazy dog. " * 3)[:48]
llama.eval(prompt)
for _ in range(4):
    llama.eval([prompt[-1]])
llama.n_tokens = len(prompt) // 2
llama.eval(prompt[len(prompt) // 2 :])
# a state written into the scratch sequence and joined to the first (llamacpp_kv)
import ctypes
from specrepl.engine.llamacpp import sequences, with_sequences
llama = with_sequences(llama, 2)
if sequences(llama) >= 2:
    llama.eval(prompt)
    size = llama_cpp.llama_state_seq_get_size(llama.ctx, 0)
    state = (ctypes.c_uint8 * size)()
    size = llama_cpp.llama_state_seq_get_data(llama.ctx, state, size, 0)
    memory = llama_cpp.llama_get_memory(llama.ctx)
    llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)
    assert llama_cpp.llama_state_seq_set_data(llama.ctx, state, size, 1) == size
    llama_cpp.llama_memory_seq_cp(memory, 1, 0, -1, -1)
    llama_cpp.llama_memory_seq_rm(memory, 1, -1, -1)
    llama.eval([prompt[-1]])
print("llama.cpp trial ok")
"""


class LlamaCppUnavailable(Exception):
    """llama.cpp cannot run this file here; the message says why."""


def import_llamacpp() -> ModuleType:
    """The `llama_cpp` module, or LlamaCppUnavailable saying why not."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise LlamaCppUnavailable(f"llama-cpp-python is not installed ({INSTALL_HINT})")
    try:
        return importlib.import_module("llama_cpp")
    except Exception as error:  # a broken build fails in many ways, all of them here
        raise LlamaCppUnavailable(f"llama-cpp-python does not import: {error}") from error


def open_gguf(
    path: Path | None,
    *,
    context_length: int,
    threads: int | None = None,
    sequences: int = 1,
    **options: Any,
) -> Any:
    """A `llama_cpp.Llama` for the GGUF file at `path` with a context of
    `context_length` tokens and `threads` threads (default: every CPU), or
    LlamaCppUnavailable saying why it cannot run here. `options` go to `Llama`.
    With `sequences` > 1 its cache holds that many sequences where the binding
    allows it (`with_sequences`; `sequences(llama)` says what it got)."""
    if path is None:
        raise LlamaCppUnavailable(
            "it runs a GGUF file and the model was not loaded from one "
            "(use the embedded model or a .gguf file)"
        )
    if not path.is_file():
        raise LlamaCppUnavailable(f"the model's GGUF file {path} is missing")
    llama_cpp = import_llamacpp()
    threads = threads or max(1, os.cpu_count() or 1)
    problem = trial_problem(path, threads=threads)
    if problem is not None:
        raise LlamaCppUnavailable(problem)
    try:
        llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=context_length,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            **options,
        )
    except Exception as error:
        raise LlamaCppUnavailable(
            f"llama-cpp-python could not load {path.name}: {error}"
        ) from error
    return with_sequences(llama, sequences) if sequences > 1 else llama


def with_sequences(llama: Any, count: int) -> Any:
    """`llama` with a context whose one cache (all positions shared, so a
    sequence may hold any of them) serves `count` sequences, or `llama` as it
    was where the binding does not allow it. `Llama` offers no such option
    (only its embedding mode sets one), so the context is made again from its
    own parameters; the old one is closed once the new one exists."""
    llama_cpp = import_llamacpp()
    params = llama.context_params
    before = (params.n_seq_max, params.kv_unified)
    try:
        from llama_cpp import _internals

        params.n_seq_max, params.kv_unified = count, True
        context = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
    except Exception:  # another binding's internals: one sequence, as before
        params.n_seq_max, params.kv_unified = before
        return llama
    old, llama._ctx = llama._ctx, context
    old.close()
    llama.n_tokens = 0
    params.n_seq_max = int(llama_cpp.llama_n_seq_max(llama.ctx))
    return llama


def sequences(llama: Any) -> int:
    """How many sequences `llama`'s context holds (1 where the binding cannot say)."""
    try:
        return int(import_llamacpp().llama_n_seq_max(llama.ctx))
    except Exception:
        return 1


_TRIED: dict[str, str | None] = {}
"""Verdicts this process has already read or reached, by trial key."""


def trial_problem(path: Path, *, threads: int = 1) -> str | None:
    """None when llama.cpp loads and runs the GGUF file at `path` here without
    crashing (tried in a child process once per binding build, CPU and file,
    and remembered); else what went wrong, in one sentence."""
    key = _trial_key(path)
    if key in _TRIED:
        return _TRIED[key]
    store = llamacpp_trials_file()
    stored = read_json_object(store).get(key)
    if isinstance(stored, dict) and isinstance(stored.get("ok"), bool):
        problem = None if stored["ok"] else str(stored.get("problem") or "it failed")
    else:
        problem, keep = _run_trial(path, threads)
        if not keep:
            return problem
        trials = read_json_object(store)  # none yet, or damaged: tried again, written anew
        trials[key] = {"ok": problem is None, "problem": problem, "tried_at": time.time()}
        write_json_object(store, trials)  # a read-only cache: the trial runs again next time
    _TRIED[key] = problem
    return problem


def _run_trial(path: Path, threads: int) -> tuple[str | None, bool]:
    """The trial's problem (None: it ran clean) and whether the verdict may be
    kept (not when the trial ran out of time)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TRIAL, str(path), str(threads)],
            capture_output=True,
            text=True,
            timeout=TRIAL_SECONDS,
            env=_trial_environment(),
        )
    except subprocess.TimeoutExpired:
        return (
            f"a trial run of {path.name} in llama.cpp did not end within {TRIAL_SECONDS:.0f} s",
            False,
        )
    if done.returncode == 0:
        return None, True
    forget = "`python infer.py cache clear llamacpp` tries again"
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return (
            f"llama.cpp crashed ({name}) running {path.name} on this CPU in a trial ({forget})",
            True,
        )
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = lines[-1][:200] if lines else f"exit status {done.returncode}"
    return f"llama.cpp failed running {path.name} in a trial: {last} ({forget})", True


def _trial_environment() -> dict[str, str]:
    """This process's environment with the folder holding this specrepl first
    on the path: the trial imports the code that runs it (`with_sequences`),
    wherever the session was started and whether or not it is installed."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _trial_key(path: Path) -> str:
    """What a verdict holds for: the binding's build, the CPU (model name and
    feature flags), the file's content and the trial's code."""
    trial = hashlib.sha256(_TRIAL.encode()).hexdigest()[:12]  # a new trial runs again
    parts = (build_identity(), _cpu_identity(), fingerprint(path), trial)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def build_identity() -> str:
    """The llama-cpp-python installed here as a stored verdict must match it:
    its version and its library files (names, sizes, times: a build for other
    instruction sets keeps the version); "llama-cpp-python=none" without one."""
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "llama-cpp-python=none"
    spec = importlib.util.find_spec("llama_cpp")
    library = []
    for location in (spec.submodule_search_locations or []) if spec else []:
        for file in sorted(Path(location).glob("lib/*")):
            stat = file.stat()
            library.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    files = hashlib.sha256("|".join(library).encode()).hexdigest()[:12]
    return f"llama-cpp-python={version} build={files}"


def _cpu_identity() -> str:
    """The CPU's model name and feature flags, as the kernel reports them (a
    model name alone, such as "AMD EPYC", can cover CPUs with different
    instruction sets)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return f"{os.uname().machine}"
    fields: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return " / ".join(
        fields.get(name, "") for name in ("model name", "cpu family", "model", "flags", "Features")
    )
