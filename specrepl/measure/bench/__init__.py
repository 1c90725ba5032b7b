"""`python infer.py bench`: speculative decoding measured side by side with its peers.

The package reads in one direction; each module imports only those above it:

- `prompts`: Spec-Bench questions (JSONL: `question_id`, `category`, `turns`)
  read and checked line by line, the copy shipped with the repository, and
  which turns form one chat;
- `prediction`: the speedup predicted from a run's measured acceptance and
  costs (Leviathan et al. 2023);
- `figures`: the methods, one run's figures (`MethodRun`), a prompt's runs
  (`PromptRecord`), and each run against the same prompt's target-only run;
- `summary`: the figures summed up per category and overall, and per kind
  of turn;
- `options`: what one benchmark measures (`BenchOptions`): the session's
  `Settings`, as the REPL runs them, and bench's own few choices (peers,
  sweep, warm-up, `--chat`, ...);
- `llamacpp`: the target's GGUF file run by llama-cpp-python;
- `peers`: what users run instead (transformers `generate()` in its forms,
  llama.cpp), and the synchronized clock every method is timed with;
- `runner`: `Benchmark`, which times every method on every turn with one
  loaded pair (warm-up, alternating order; a later turn asked after the
  earlier ones and their target-only answers, with `--chat` the caches kept
  from turn to turn);
- `report`: `BenchReport`, a finished benchmark with its machine, versions and
  settings, and its JSON;
- `markdown`: a run (or several side by side) as Markdown tables, from the
  JSON alone (`python infer.py compare`);
- `tables`: the rich tables and the matplotlib chart;
- `command`: the command line (flags, loading, progress bar, exit status).

Nothing above `tables` imports rich, and `prompts`, `prediction`, `figures`,
`summary`, `options` and `markdown` import no torch either, so `compare`
starts without loading a model library. This file imports nothing:
`from specrepl.measure.bench.runner import Benchmark`.
"""
