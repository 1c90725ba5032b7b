"""The application: the command line, the REPL, slash commands, start-up and
rendering. The only layer that prints.
"""
