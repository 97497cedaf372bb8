"""``python -m preflight check``: the command of a preflight pod (and of the harness's checks).

Prints the verdict as one JSON object (``--machine`` given several times:
one JSON object per line, one per simulated machine). Exit 0: passed; 1:
failed (the reasons are in the JSON); 4: the checks could not run -- one line
on stderr, nothing on stdout, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import xids


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 4 (argparse's default is a usage block and exit 2)
        print(f"preflight: {message} (see python -m preflight check --help)", file=sys.stderr)
        sys.exit(4)


def _xid_list(text: str) -> frozenset[int]:
    try:
        return frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ignore-xids {text!r} must be comma-separated XID numbers") from None


def parse(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m preflight")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("check", help="check this node's GPUs and print a JSON verdict")
    c.add_argument("--expect-gpus", type=int, default=None, metavar="N",
                   help="fail unless NVML sees exactly N GPUs (default: any number)")
    c.add_argument("--xid-window-ms", type=int, default=1000, metavar="MS",
                   help="how long to watch for XID events after registering (default 1000)")
    c.add_argument("--ignore-xids", type=_xid_list, default=xids.APPLICATION_XIDS, metavar="LIST",
                   help="XIDs that do not fail the node (default: NVIDIA device plugin's application "
                        f"XIDs {','.join(map(str, sorted(xids.APPLICATION_XIDS)))})")
    c.add_argument("--max-temp-c", type=int, default=85,
                   help="temperature limit for GPUs that report no slowdown threshold (default 85)")
    c.add_argument("--machine", action="append", default=None, metavar="NAME",
                   help="simulation only: the simulated machine the project's mock NVML library serves "
                        "(repeatable: one JSON line per machine)")
    args = p.parse_args(argv)
    if args.expect_gpus is not None and args.expect_gpus < 1:
        p.error(f"--expect-gpus must be >= 1, got {args.expect_gpus}")
    if args.xid_window_ms < 0:
        p.error(f"--xid-window-ms must be >= 0, got {args.xid_window_ms}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        from .checker import CannotCheck, Options, check
    except ImportError as e:  # nvidia-ml-py missing from the image
        print(f"preflight: cannot import the NVML binding ({e}): pip install nvidia-ml-py", file=sys.stderr)
        return 4
    opts = Options(args.expect_gpus, args.xid_window_ms, args.ignore_xids, args.max_temp_c)
    worst = 0
    try:
        for machine in args.machine or [None]:
            verdict = check(opts, machine)
            print(json.dumps(verdict.as_dict(), sort_keys=True), flush=True)
            worst = max(worst, 0 if verdict.ok else 1)
    except CannotCheck as e:
        print(f"preflight: {e}", file=sys.stderr)
        return 4
    return worst


if __name__ == "__main__":
    sys.exit(main())
