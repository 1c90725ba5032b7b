"""The REPL's slash commands: one registry, each command declared once.

- registry.py: how a command is declared (`@REGISTRY.command`: name, aliases,
  typed arguments, one line of help, handler), parsed, completed and
  dispatched; `/help` and completion are generated from it.
- results.py: what a handler returns; the renderer draws each result by its type.
- settings.py: the commands that change a setting (`/gamma`, `/processor`, ...).
- session.py: the commands about the session and the REPL (`/reset`, `/models`,
  `/help`, `/quit`, ...).

To add a command, declare it with `@REGISTRY.command(...)` on its handler in the
module of its concern; a new module of commands is also imported below, which
is what registers its commands (in the order `/help` lists them).
"""

# Importing a module of commands declares them; `/help` lists them in this order.
from specrepl.app.commands import settings  # noqa: F401

# isort: split
from specrepl.app.commands import session  # noqa: F401
