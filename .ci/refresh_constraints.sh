#!/usr/bin/env bash
# Regenerates constraints.txt, the lock both README commands install from (`-c constraints.txt`).
#
#   bash .ci/refresh_constraints.sh              # fresh venv in a temp dir, newest releases
#   bash .ci/refresh_constraints.sh --from .venv # freeze an existing venv instead (no install)
#
# The fresh venv installs `-e '.[dev,tpu]'` (what .ci/run installs) WITHOUT the old lock,
# so every package the test install pulls in is re-resolved against setup.py's ranges; its
# `pip freeze` (kjax itself left out) becomes the new lock. Run it with the Python CI uses:
# the pins are resolved for that interpreter. Then rerun README command (2) and commit
# constraints.txt with the table results it produced. Local version labels (torch's
# "+cpu") are dropped so that the pin matches the same release from PyPI or a local wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ "${1:-}" = "--from" ]; then
  venv=${2:?"--from needs a virtualenv directory, e.g. --from .venv"}
  [ -x "$venv/bin/pip" ] || { echo "refresh_constraints: no $venv/bin/pip" >&2; exit 2; }
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  venv=$tmp/venv
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --no-compile -e '.[dev,tpu]'
fi
"$venv/bin/pip" check

pyver=$("$venv/bin/python" -c 'import platform; print(platform.python_version(), platform.system(), platform.machine())')
{
  echo "# Pinned environment of kjax: every package that \`pip install -e '.[dev]'\` installs,"
  echo "# so README command (1) (-e .) and command (2) (-e '.[dev]') both install exactly these"
  echo "# versions: \`pip install -c constraints.txt -e '.[dev]'\`. A table verdict depends on the"
  echo "# environment (10 of 27 changed between two unpinned installs); BUILD.md, Pinned environment."
  echo "# Resolved on Python $pyver; do not edit by hand. Refresh (new releases, new"
  echo "# dependency in setup.py): bash .ci/refresh_constraints.sh"
  "$venv/bin/pip" freeze --exclude-editable | sed -E 's/^([^=]+==[^+]+)\+.*$/\1/'
} >constraints.txt.new
mv constraints.txt.new constraints.txt
echo "refresh_constraints: wrote constraints.txt ($(grep -vc '^#' constraints.txt) packages)"
