"""Drafters: what proposes the tokens the target verifies.

One interface (`base.Drafter`), one module per kind (`model`, `ngram`,
`lookup`, `hybrid`, `head`, and `llamacpp` for the drafter model run in
llama.cpp), and one builder (`builder.build_drafter`) that turns a drafter
spec into a drafter for every entry point (the REPL, `bench`, `soak`,
`replay`, the library API). `options` names the kinds without torch;
`runtime` chooses what runs the drafter model; `draft_head` and `head_store`
are the draft head's network and files; `llamacpp_kv` hands the target's keys
and values to llama.cpp.
"""
