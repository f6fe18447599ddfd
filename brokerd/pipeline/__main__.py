"""``python -m brokerd.pipeline report ...`` (the same as ``brokerd-report ...``),
``python -m brokerd.pipeline compact ...`` (``brokerd-report compact ...``) and
``python -m brokerd.pipeline generate --data-dir DIR --events N`` (a synthetic log)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        from brokerd.pipeline.cli import run

        return run(argv[1:], prog="python -m brokerd.pipeline report")
    if argv and argv[0] == "compact":
        from brokerd.pipeline.cli import run_compact

        return run_compact(argv[1:], prog="python -m brokerd.pipeline compact")
    if argv and argv[0] == "generate":
        from brokerd.pipeline.generate import generate

        parser = argparse.ArgumentParser(prog="python -m brokerd.pipeline generate")
        parser.add_argument("--data-dir", required=True)
        parser.add_argument("--events", type=int, default=1_000_000)
        parser.add_argument("--hours", type=int, default=10)
        parser.add_argument("--seed", type=int, default=1)
        args = parser.parse_args(argv[1:])
        written = generate(args.data_dir, args.events, hours=args.hours, seed=args.seed)
        print(f"wrote {written:,} events under {args.data_dir}/events")
        return 0
    print("usage: python -m brokerd.pipeline {report,compact,generate} ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
