"""Measuring commands: `bench` (speed against peers), `soak` (a long session
stays flat) and `replay` (a scripted chat, turn by turn).

They run the same chat session and drafter builder as the REPL.
"""
