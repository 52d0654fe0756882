"""The three gRPC daemons (admission, scheduler, usage), their shared runtime and the CLI.

Layer: services (adapters). Everything here translates and transports; the accounting rules live
in the pure `accounting` package.
"""
