"""Models: loading a target and drafter pair, and what each loaded model needs.

`loading` loads a pair (`load_pair`) from `specs` (which model, dtype,
quantization), through `sources` (embedded, GGUF, directory, hub), `gguf`
(converted copies), `devices` and `quantization`; `pair` checks the two fit
(`compatibility`) and `loaded` describes each model and carries its tuning.
`tuning` is the one place that changes a loaded model for speed, and
`width_plans` times a pair's forward widths once per machine. `prompting`
holds the chat templates.

Builds on the engine (the tuning object, timing) and the store (where
converted copies and plans live). Knows nothing of the REPL, settings or
rendering.
"""
