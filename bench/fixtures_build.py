"""How long the embedded default's fixtures take: imports, a cold build, a reuse check.

    PYTHONPATH=src python bench/fixtures_build.py [DEST]

Prints the figures measured in this one run (wall seconds; the size on disk).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="dancegrpo-fixtures-bench-")) / "fixtures"
    t0 = time.perf_counter()
    import diffusers  # noqa: F401  (the imports a build needs, timed apart from the build)
    import hpsv2.src.open_clip  # noqa: F401
    import torch  # noqa: F401

    from dancegrpo_npu.smoke.fixtures import is_current
    from dancegrpo_npu.trainers.flux.fixtures import build_fixtures, params_sha256

    t1 = time.perf_counter()
    was_current = is_current(dest, params_sha256())
    fixtures = build_fixtures(dest)
    t2 = time.perf_counter()
    build_fixtures(dest)
    t3 = time.perf_counter()
    size = sum(p.stat().st_size for p in fixtures.root.rglob("*") if p.is_file())
    print(f"imports          {t1 - t0:6.2f} s")
    print(f"build{' (reused)' if was_current else '         '}   {t2 - t1:6.2f} s")
    print(f"reuse check      {t3 - t2:6.2f} s")
    print(f"size on disk     {size / 2**20:6.1f} MiB  ({fixtures.root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
