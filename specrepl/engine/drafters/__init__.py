"""Drafters: what proposes the tokens the target verifies.

One interface (`Drafter`), one module per kind, and one builder that turns a
drafter spec into a drafter for every entry point (the REPL, `bench`, `soak`,
`replay`, the library API).
"""
