"""Models: loading a target and drafter pair, GGUF conversion, tokenizer
checks, chat templates and quantization.

Builds on the engine (timing plans for what it loads) and the store (where
converted copies live). Knows nothing of the REPL, settings or rendering.
"""
