"""The command line: ``python -m vit_demo COMMAND ...``, one module per command.

:mod:`.main` builds the parser from :data:`~vit_demo.cli.main.COMMANDS` (each command module
has ``register(subparsers)`` and a ``run(args)`` it sets as the handler) and turns every
expected error into one line on stderr with exit code 2; :mod:`.common` holds the flags and
checks several commands share.
"""
