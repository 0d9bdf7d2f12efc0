#!/usr/bin/env bash
# The API reference: HTML pages generated from the docstrings of the public modules (pdoc), into build/api/
# (or the folder given). A warning (a broken cross-reference, a module that does not import) fails the build.
#   bash scripts/api_docs.sh            # then open build/api/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/api}"
mapfile -t modules < <(python3 -c "import hpc_graph._api_modules as m; print('\n'.join(m.SPECS))")
# PDOC_ALLOW_EXEC: platform.processor() runs `uname -p` when torch's dependencies are imported
PDOC_ALLOW_EXEC=1 python3 -W error -m pdoc --docformat google -o "$out" "${modules[@]}"
echo "API reference in $out/index.html"
