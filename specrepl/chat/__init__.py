"""The chat program: settings, the config that fills them, the flags that
change them, the one front door that loads the config's pair (`loading`),
and the session that answers one turn with the speculative generator and its
peers.

The REPL and the measuring commands (`bench`, `soak`, `replay`) both run this
layer, so what is measured is what a user runs. Knows nothing of the terminal:
no rich, no prompt_toolkit.
"""
