"""The ``hami-accounting`` command line: the dispatcher, one module per subcommand, and the
table and option helpers the tools share.

Layer: services/cli, the top of the house: it imports the daemons (``serve`` runs them in this
process), ``services.common`` and ``accounting``; nothing imports it (``.importlinter``). The
client tools (``demo``, ``explain``, ``usage``, ``what-if``, ``health``, ``up``) talk to the
daemons over gRPC only; ``journal`` works on the recorder's files, so it imports the recorder's
journal modules.
"""
