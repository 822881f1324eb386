#!/usr/bin/env bash
# Run the test suite (the README's second command; .ci/run calls it).
#
#   ./scripts/test.sh                 every test
#   ./scripts/test.sh -m "not slow"   extra arguments go to pytest
#
# Installs what the tests need first (./scripts/bootstrap.sh --deps-only, a no-op when
# up to date).  Tests that need the real upstream DanceGRPO fetch it from the locked URL
# (git's url.<base>.insteadOf mirrors apply) or from DANCEGRPO_SOURCE, and are skipped
# with the reason when it cannot be fetched; the count of those is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DANCEGRPO_VENV:-$PWD/.venv}

./scripts/bootstrap.sh --deps-only

mkdir -p build
results=build/test-results.xml
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider --junitxml="$results" "$@"
status=$?
set -e

# One closing line with the counts, and how many tests were skipped for lack of upstream.
"$VENV/bin/python" - "$results" "$status" <<'EOF'
import sys
import xml.etree.ElementTree as ET

path, status = sys.argv[1], int(sys.argv[2])
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as e:
    print(f"test.sh: no test report ({e}); pytest exited {status}")
    sys.exit(0)
passed = failed = skipped = no_upstream = 0
for case in root.iter("testcase"):
    kinds = {child.tag for child in case}
    if kinds & {"failure", "error"}:
        failed += 1
    elif "skipped" in kinds:
        skipped += 1
        msg = " ".join((c.get("message") or "") + (c.text or "") for c in case if c.tag == "skipped")
        no_upstream += "upstream unavailable:" in msg
    else:
        passed += 1
print(f"test.sh: {passed + failed + skipped} tests ran; {skipped} skipped, {no_upstream} of them for lack of upstream")
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
EOF

if [ "$status" -eq 5 ]; then
  echo "test.sh: error: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
