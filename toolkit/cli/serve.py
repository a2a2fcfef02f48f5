"""The fake provider as an HTTP service on 127.0.0.1: serve-provider."""

import sys

from toolkit.cli import command, finite
from toolkit.errors import ToolkitError


@command("serve-provider", "Serve the fake provider over HTTP on 127.0.0.1 until SIGTERM or Ctrl-C.")
def _serve(parser):
    from toolkit.provider import CONTRACT_FORMS

    parser.add_argument("--db", required=True, help="the provider's SQLite job table")
    parser.add_argument("--out", required=True, help="folder for uploads and artifacts")
    parser.add_argument("--port", required=True, type=int,
                        help="TCP port on 127.0.0.1 (0: any free port; the URL is printed)")
    parser.add_argument("--contract", default="idempotent", help=f"contract: {CONTRACT_FORMS}")
    parser.add_argument("--until-stdin-closes", action="store_true",
                        help="also stop when stdin reaches EOF (whoever started the service "
                             "holds its other end: the service dies with it, even by kill -9)")
    faults = parser.add_argument_group("faults the service does to itself (drills)")
    faults.add_argument("--slow-submits", type=int, default=0, metavar="N",
                        help="the first N submits keep their job running --slow-seconds before "
                             "it commits and the reply goes out (a client's read timeout fires)")
    faults.add_argument("--slow-seconds", type=float, default=0.0, metavar="S")
    faults.add_argument("--cut-fetches", type=int, default=0, metavar="N",
                        help="the first N artifact downloads stop halfway (full Content-Length)")
    faults.add_argument("--drop-submits", type=int, default=0, metavar="N",
                        help="the first N submits are accepted and executed, then the connection "
                             "drops with no reply (a lost reply)")
    faults.add_argument("--refuse-submits", type=int, default=0, metavar="N",
                        help="the first N submits are refused with 503 transient (nothing "
                             "accepted)")

    def run(args):
        from toolkit.provider import parse_contract
        from toolkit.provider.service import ServiceFaults, serve

        if not 0 <= args.port <= 65535:
            raise ToolkitError("--port must be within 0..65535")
        finite("--slow-seconds", args.slow_seconds)
        if min(args.slow_submits, args.slow_seconds, args.cut_fetches, args.drop_submits,
               args.refuse_submits) < 0:
            raise ToolkitError("--slow-submits, --slow-seconds, --cut-fetches, --drop-submits and "
                               "--refuse-submits must be >= 0")
        faults = ServiceFaults(args.slow_submits, args.slow_seconds, args.cut_fetches,
                               args.drop_submits, args.refuse_submits)
        serve(args.db, args.out, parse_contract(args.contract), args.port, faults,
              ready=lambda line: print(line, flush=True),
              until_stdin_closes=args.until_stdin_closes)
        print("stopped", file=sys.stderr)
    return run
