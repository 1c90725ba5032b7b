"""`python infer.py soak`: one long session, watched for memory growth and checked
for determinism.

The soak runs many prompts through a single `ChatSession`, the way a long REPL
session would: it cycles over a list of prompts and over setting changes
(gamma and its policy, the drafter kind, the logits processor, the KV cache,
chat on and off, the drafter-only run), clears the history every few prompts,
and after each prompt

- samples the process's resident memory (RSS), and
- answers the same prompt again in a fresh `ChatSession` given the same
  settings, seed and history: every run must give the same tokens, both
  sessions must end with the same history, and a greedy speculative run must
  give the target's tokens.

- loop.py: the soak itself (`soak`, its options, prompts and setting variants).
- result.py: what it measured (`SoakResult`, `Mismatch`) and how RSS is read.
- command.py: the subcommand: its flags and `run(args, front)`.
"""
