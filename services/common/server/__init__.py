"""The daemons' gRPC servers, and the client channel they dial each other with.

Layer: services (runtime). A daemon's server is built on one of two runners, chosen by
measurement (docs/server-choice.md):

* ``thread_pool``: a synchronous ``grpc.server``, each call on a pool thread (admission, the
  scheduler);
* ``event_loop``: grpc.aio on an event loop of its own (``loop_thread``), streams on the loop
  (the usage recorder).

Both register their servicers the same way (``registration``: the decode guard of
``decode_guard`` and the call telemetry of ``call_telemetry``, once per handler), bind through
``listen``, and hand back the same ``ServerHandle`` (``handle``); ``signals`` turns SIGTERM and
SIGINT into a graceful stop, ``channel`` is the client side. This module hands on the names the
daemons, the tools and the tests import.
"""

from services.common.server.channel import client_channel
from services.common.server.event_loop import UnaryCalls, build_aio_server
from services.common.server.handle import ServerHandle
from services.common.server.listen import ServerStartError
from services.common.server.signals import StopSignals, run_until_signalled
from services.common.server.thread_pool import build_server, build_service_server

__all__ = [
    "ServerHandle",
    "ServerStartError",
    "StopSignals",
    "UnaryCalls",
    "build_aio_server",
    "build_server",
    "build_service_server",
    "client_channel",
    "run_until_signalled",
]
