"""The closing lines of scripts/test.sh: counts from pytest's JUnit XML report.

    python scripts/test_summary.py REPORT.xml PYTEST_EXIT_STATUS

Says how many tests were skipped for lack of upstream (reason "upstream unavailable: ...",
tests/conftest.py) and, under CI, how many failed for that reason instead of being skipped.
Always exits 0: test.sh's own exit status is pytest's.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

UPSTREAM_UNAVAILABLE = "upstream unavailable:"  # tests/conftest.py's prefix


def _text(case: ET.Element, tags: set[str]) -> str:
    return " ".join((c.get("message") or "") + " " + (c.text or "") for c in case if c.tag in tags)


def summary(path: str, status: int) -> list[str]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return [f"test.sh: no test report ({e}); pytest exited {status}"]
    passed = failed = skipped = skipped_no_upstream = failed_no_upstream = 0
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
            failed_no_upstream += UPSTREAM_UNAVAILABLE in _text(case, {"failure", "error"})
        elif "skipped" in kinds:
            skipped += 1
            skipped_no_upstream += UPSTREAM_UNAVAILABLE in _text(case, {"skipped"})
        else:
            passed += 1
    lines = [
        f"test.sh: {passed + failed + skipped} tests ran; {skipped} skipped, {skipped_no_upstream} of them for lack of upstream"
    ]
    if failed_no_upstream:
        lines.append(
            f"test.sh: {failed_no_upstream} failed for lack of upstream (under CI a test that needs upstream fails instead of skipping)"
        )
    lines.append(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return lines


if __name__ == "__main__":
    print("\n".join(summary(sys.argv[1], int(sys.argv[2]))))
