"""Drafters: what proposes the tokens the target verifies.

One interface (`base.Drafter`), one module per kind (`model`, `ngram`,
`lookup`, `hybrid`, `head`), and one builder (`builder.build_drafter`) that
turns a drafter spec into a drafter for every entry point (the REPL, `bench`,
`soak`, `replay`, the library API). `options` names the kinds without torch.
The model drafter runs its model over a draft runtime (`draft_runtime`:
torch; `llamacpp`: llama.cpp) and records what that holds in a `draft_view`;
`runtime` chooses which runtime runs the drafter model; `llamacpp_kv` and
`llamacpp_state` hand the target's keys and values to a copy in llama.cpp;
`draft_head` and `head_store` are the draft head's network and files.
"""
