"""The commands of `fencepost`, one module per command group; `cli.main` adds each group to the root.

A command module only parses options and calls the packages (``broker.admin``, ``broker.api``,
``election``, ``pipeline`` ...), printing what they return. What every command shares lives here
too: :mod:`commands.options` (which cluster a command talks to; options generated from config
dataclasses), :mod:`commands.checks` (values checked before any server is contacted),
:mod:`commands.errors` (one-line errors and exit codes) and :mod:`commands.output` (JSON or text,
tables, task records). Only the development commands (:mod:`commands.dev`, :mod:`commands.zk`,
:mod:`commands.bench`, :mod:`commands.chaos`) call into ``devtools``.

Exit codes: 0 success, 1 operation failed (one-line reason on stderr), 2 usage error.
"""
