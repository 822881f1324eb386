"""``python -m dancegrpo_npu`` and the ``dancegrpo-npu`` console script (``run``).

Only ``sys`` is imported before the try: a Ctrl-C while the command's own modules load is one
line and exit 130 like a Ctrl-C in a verb (``cli.main`` handles those).
"""

import sys


def run() -> int:
    try:
        from dancegrpo_npu.cli import main
    except KeyboardInterrupt:
        from dancegrpo_npu.errors import INTERRUPTED

        print(f"dancegrpo-npu: {INTERRUPTED}", file=sys.stderr)
        return 128 + 2  # as cli.EXIT_INTERRUPTED: a shell's status for a Ctrl-C
    return main()


if __name__ == "__main__":
    sys.exit(run())
