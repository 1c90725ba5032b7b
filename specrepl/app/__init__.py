"""The application: the command line, the REPL, slash commands, start-up and
rendering. The only layer that prints.

- cli.py: the command line; declares the subcommands and dispatches.
- front.py: the front door every entry point goes through to its models.
- repl.py: the read-eval-print loop; startup.py: loading behind its prompt.
- commands/: the slash commands, one registry (where to add a command).
- render/: everything drawn on the terminal.
- disk_cache.py: `python infer.py cache`; launcher.py: the process entry point.
"""
