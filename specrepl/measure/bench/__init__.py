"""`python infer.py bench`: speculative decoding measured side by side with its peers.

The package reads in one direction; each module imports only those above it:

- `prompts`: Spec-Bench questions (JSONL: `question_id`, `category`, `turns`)
  read and checked line by line, the copy shipped with the repository, and
  which turns form one chat;
- `figures`: the methods, one run's figures (`MethodRun`), a prompt's runs
  (`PromptRecord`), the speedup predicted from measured acceptance and costs,
  and the summaries per category and overall;
- `runner`: `Benchmark`, which times every method on every turn with one
  loaded pair (warm-up, alternating order, synchronized clock; a later turn
  asked after the earlier ones and their target-only answers, with `--chat`
  the caches kept from turn to turn);
- `report`: `BenchReport`, a finished benchmark with its machine, versions and
  settings, and its JSON;
- `markdown`: a run (or several side by side) as Markdown tables, from the
  JSON alone (`python infer.py compare`);
- `tables`: the rich tables and the matplotlib chart;
- `command`: the command line (flags, loading, progress bar, exit status).

Nothing above `tables` imports rich, and `prompts`, `figures` and `markdown`
import no torch either, so `compare` starts without loading a model library.
This file imports nothing: `from specrepl.measure.bench.runner import Benchmark`.
"""
