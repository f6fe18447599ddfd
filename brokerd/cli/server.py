"""``brokerd``: run the broker as a foreground server.

The same options as ``twistd brokerd`` (brokerd.tap.Options), run the way a service manager or
a terminal expects a server to run: in the foreground, logging to standard output (or
``--logfile FILE``), no pid file unless ``--pidfile FILE`` is given, stopped cleanly by Ctrl-C
or SIGTERM.  twistd's own runner does the work (its signal handling, its logging), with
brokerd's service as its only command, so it needs no plugin discovery and reads no
``twistd.pid``.
"""
from __future__ import annotations

import sys

from twisted.application.service import ServiceMaker
from twisted.scripts.twistd import runApp

from brokerd.tap import Options
from brokerd.twistedio import twistd_with_one_command

USAGE = """Usage: brokerd [--pidfile FILE] [--logfile FILE] [options]

Runs brokerd in the foreground until Ctrl-C or SIGTERM.  The options are those of
`twistd brokerd` (docs/operations.md); `brokerd --check-config [options]` checks them and
exits.
  --pidfile FILE  write the process id to FILE while running [none]
  --logfile FILE  log to FILE (rotated by size, as twistd does) [standard output]
"""

SERVICE = ServiceMaker("brokerd", "brokerd.tap", "A message broker: SSMP, MCCHAT, SMQP and socket.mq.", "brokerd")
"""What twistd's runner builds the application from (the plugin twistd finds is the same)."""

_RUNNER_OPTIONS = ("--pidfile", "--logfile")


BrokerdServerOptions = twistd_with_one_command(SERVICE)
"""twistd's options, with brokerd's service as the one command."""


def twistd_arguments(args: list[str]) -> list[str]:
    """twistd's command line for ``brokerd ARGS``: ``--pidfile`` and ``--logfile`` go to the
    runner, everything else to brokerd's options."""
    runner = {"--pidfile": ""}
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        name, equals, value = arg.partition("=")
        if name in _RUNNER_OPTIONS:
            if not equals:
                following = next(items, None)
                if following is None:
                    raise SystemExit(f"brokerd: {name} needs a file name")
                value = following
            runner[name] = value
        else:
            rest.append(arg)
    command = ["--nodaemon", f"--pidfile={runner['--pidfile']}"]
    if "--logfile" in runner:
        command.append(f"--logfile={runner['--logfile']}")
    return [*command, SERVICE.tapname, *rest]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        print(str(Options()).split("\n", 1)[1])  # the options' table, without twistd's synopsis
        return
    sys.argv = ["brokerd", *twistd_arguments(args)]
    config = BrokerdServerOptions()
    try:
        config.parseOptions(sys.argv[1:])
    except SystemExit:
        raise
    except Exception as exc:  # usage.UsageError: one line, not twistd's help text
        raise SystemExit(f"brokerd: {exc} (brokerd --help lists the options)") from None
    runApp(config)


if __name__ == "__main__":
    main()
