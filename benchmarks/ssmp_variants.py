"""Where brokerd's CPU per SSMP message goes: a revision beside variants of it, each with one
feature taken out, and the minimal server, in the in-process harness (ssmp_cpu.py).

    python benchmarks/ssmp_variants.py                       # HEAD, every variant, minimal; (a), (c), (d), (r)
    python benchmarks/ssmp_variants.py --only d --rounds 7
    python benchmarks/ssmp_variants.py --variants observer,flow --keep /tmp/variants

Each variant is ``git archive REV brokerd`` with a few exact lines replaced (VARIANTS below):
not a broker anyone should run (it drops a guarantee), but the measured price of that
guarantee.  A replacement that no longer matches the source stops the script, so the
variants cannot silently measure nothing after the code moved.  There is no variant for the
durable hand-off: the router's durable stage (Router._multicast_keeping) is installed only with
a durable service, and the harness's node has none, so its path has no durable test to take out
(the server's ``publication.kept`` test goes with ``core``).  The difference between a
variant and the revision is what the feature costs per message; ``all`` takes every one of
them out at once, and what is left beside the minimal server is the structure itself
(framing, parse, one request loop, run rendering, replies).  Results: docs/performance-history.md.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = "brokerd/protocols/ssmp/server.py"
WIRE = "brokerd/protocols/ssmp/wire.py"
FLOW = "brokerd/protocols/flow.py"
BROKER = "brokerd/core/broker.py"
ROUTER = "brokerd/core/router.py"

Edit = tuple[str, str, str]
"""(file, exact text, replacement): the text must occur in the file."""

VARIANTS: dict[str, tuple[str, list[Edit]]] = {
    "observer": ("no event-log call (the broker's observer is None, so the router has no observer stage)", [
        (BROKER, "        self._observer = self.live.observer = observer\n        self.router.install(observer=observer)\n",
                 "        self._observer = self.live.observer = None\n        self.router.install(observer=None)\n"),
    ]),
    "counters": ("no operations counters (published, delivered, by protocol and format: Router._multicast,"
                 " fan_out, _unicast, _send_to)", [
        (ROUTER, "        stats = self.stats\n        stats.published += len(messages)\n"
                 "        stats.accepted_by[first.protocol] += len(messages)\n        delivered = self.fan_out(",
                 "        delivered = self.fan_out("),
        (ROUTER, "        stats = self.stats\n        routed = stats.routed_by[first.protocol]\n        count = len(messages)\n",
                 "        count = len(messages)\n"),
        (ROUTER, "            delivered += recipients * carried\n            routed[fmt] += recipients * carried\n",
                 "            delivered += recipients * carried\n"),
        (ROUTER, "        stats.delivered += delivered\n        stats.unrenderable += unrenderable\n", ""),
        (ROUTER, "        count = len(messages)\n        stats = self.stats\n        stats.published += count\n"
                 "        stats.accepted_by[messages[0].protocol] += count\n",
                 "        count = len(messages)\n"),
        (ROUTER, "                recipient.send(data)\n                stats.delivered += len(messages)\n"
                 "                stats.routed_by[messages[0].protocol][fmt] += len(messages)\n",
                 "                recipient.send(data)\n"),
        (ROUTER, "        sent = len(messages) - parts.count(None)\n        stats.delivered += sent\n"
                 "        stats.unrenderable += len(messages) - sent\n        if sent:\n"
                 "            stats.routed_by[messages[0].protocol][fmt] += sent\n", ""),
    ]),
    "permissions": ("no access decision: the request loop's and the router's `policy is not None`"
                    " and system-topic tests", [
        (SERVER, "        guarded = access.policy is not None\n", "        guarded = False\n"),
        (SERVER, "if (guarded or target[0] == SYSTEM_MARK) and not access.allows(", "if False and not access.allows("),
        (ROUTER, "# _accept, inlined: the path every single node's multicast takes\n        topic = first.target\n"
                 "        assert topic is not None  # a multicast names its topic (Message.target)\n"
                 "        if self.access.policy is not None or topic[:1] == _SYSTEM:\n",
                 "# _accept, inlined: the path every single node's multicast takes\n        topic = first.target\n"
                 "        assert topic is not None  # a multicast names its topic (Message.target)\n"
                 "        if False:\n"),
        (ROUTER, "        if self.access.policy is not None:\n            self.check_publish(messages[0], inbox(recipient.principal))",
                 "        if False:\n            self.check_publish(messages[0], inbox(recipient.principal))"),
    ]),
    "core": ("SSMP renders an MCAST run and sends it to the topic's members itself, past the router"
             " (Router.route's dispatch; _multicast: access and system-topic test, counters, retain test;"
             " fan_out: topic lookup, the generic per-format render and send loop, counters, observer;"
             " the server's test of publication.kept)", [
        (SERVER, "        broker = self.factory.broker\n        publication = Multicast(run, self)\n"
                 "        broker.route(publication)\n"
                 "        if publication.kept is not None:  # kept for durable subscribers: the answers wait for it\n"
                 "            self._hold(publication.kept, len(run))\n",
                 "        topic = self.factory.broker.topics.get(run[0].target)\n"
                 "        if topic is not None:\n"
                 "            data = SSMP_WIRE.render_run(run)\n"
                 "            for _fmt, members in topic.fanout():\n"
                 "                for member in members:\n"
                 "                    if member is not self:\n"
                 "                        member.send(data)\n"),
    ]),
    "flow": ("no flow control: no read holding, sends straight to transport.write", [
        (FLOW, "        self._output_limit = limit\n        self.send = self.deliver\n",
               "        self._output_limit = limit\n        self.send = self.transport.write\n"),
        (FLOW, "        if self.send == self.deliver:\n            self._read_held = into", "        if False:\n"
                                                                                      "            self._read_held = into"),
        (FLOW, "    global _corked\n    if _corked is not None:\n        return False\n    _corked = []\n    return True\n",
               "    return False\n"),
    ]),
    "validation": ("no validation: the request loop's id and payload checks, the run renderer's"
                   " per-message check, the UCAST run's length limit", [
        (SERVER, "                if not (separated and target in known and payload and payload[0] > 3"
                 " and len(payload) <= MAX_PAYLOAD):",
                 "                if not separated:"),
        (WIRE, "            if message.binary or message.sender_name is not sender or message.protocol != \"ssmp\":\n"
               "                return None\n", "            pass\n"),
        (SERVER, "if ucasts[0].target == target and len(ucasts) < self._ucast_limit:", "if ucasts[0].target == target:"),
    ]),
    "state": ("no per-request state checks (closed, logged in)", [
        (SERVER, "            if self.closed:\n                return\n            verb, sp, rest = line.partition(b\" \")\n",
                 "            verb, sp, rest = line.partition(b\" \")\n"),
        (SERVER, "            if (verb == _UCAST or verb == _MCAST) and self._dispatch is not _BEFORE_LOGIN:",
                 "            if verb == _UCAST or verb == _MCAST:"),
    ]),
    "message": ("the core's Message made as a bare tuple (tuple.__new__ of a namedtuple with its fields)"
                " instead of Message.__init__", [
        (SERVER, "from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Message\n",
                 "from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Message\n"
                 "from collections import namedtuple as _nt\n"
                 "_Bare = _nt('_Bare', 'kind target payload protocol sender_name binary display_name details principal')\n"
                 "_bare = tuple.__new__\n"),
        (SERVER, "run.append(Message(MULTICAST, target, payload, \"ssmp\", name, False, None, PLAIN, principal))",
                 "run.append(_bare(_Bare, (MULTICAST, target, payload, \"ssmp\", name, False, None, PLAIN, principal)))"),
        (SERVER, "ucasts.append(Message(UNICAST, target, payload, \"ssmp\", name, False, None, PLAIN,\n"
                 "                                                      principal))",
                 "ucasts.append(_bare(_Bare, (UNICAST, target, payload, \"ssmp\", name, False, None, PLAIN, principal)))"),
        (SERVER, "            return Message(UNICAST, target, payload, \"ssmp\", self.name, False, None, PLAIN, self.principal)",
                 "            return _bare(_Bare, (UNICAST, target, payload, \"ssmp\", self.name, False, None, PLAIN, self.principal))"),
    ]),
}


def export(revision: str, into: Path) -> None:
    archive = subprocess.run(["git", "archive", revision, "brokerd"], cwd=REPO, check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def apply(tree: Path, edits: list[Edit], name: str) -> None:
    for file, old, new in edits:
        path = tree / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: {file} has {text.count(old)} copies of {old!r}; update VARIANTS")
        path.write_text(text.replace(old, new))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default="HEAD", help="the revision the variants are made of [HEAD]")
    parser.add_argument("--variants", default=",".join([*VARIANTS, "all"]),
                        help=f"comma-separated, of {', '.join(VARIANTS)}, all [every one, and all]")
    parser.add_argument("--only", default="a,c,d,r", help="workloads of ssmp_cpu.py [a,c,d,r]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=32000)
    parser.add_argument("--keep", metavar="DIR", help="make the trees in DIR and keep them [a temporary directory]")
    options = parser.parse_args()
    chosen = options.variants.split(",")
    for name in chosen:
        if name != "all" and name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}")
    work = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="ssmp-variants-"))
    trees = {options.commit: work / "base"}
    export(options.commit, trees[options.commit])
    for name in chosen:
        tree = trees[name] = work / name
        export(options.commit, tree)
        for part in ([v for v in VARIANTS if v != "core"] if name == "all" else [name]):
            apply(tree, VARIANTS[part][1], part)
    for name in chosen:
        print(f"{name}: {VARIANTS[name][0] if name != 'all' else 'every variant above at once but core'}")
    command = [sys.executable, str(REPO / "benchmarks" / "ssmp_cpu.py"), "--minimal", "--event-log-too",
               "--only", options.only,
               "--rounds", str(options.rounds), "--messages", str(options.messages)]
    for label, tree in trees.items():
        command += ["--tree", f"{label}={tree}"]
    sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
