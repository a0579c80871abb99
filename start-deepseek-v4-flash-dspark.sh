#!/usr/bin/env bash
# Start DeepSeek-V4-Flash across the DGX Spark nodes: `dspark start` with shell-side
# validation of the numeric knobs first, so a bad value fails before Python starts.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=dspark-numeric-knobs.sh
source "$here/dspark-numeric-knobs.sh"

if [[ -x "$here/.venv/bin/dspark" ]]; then
  exec "$here/.venv/bin/dspark" start "$@"
elif command -v dspark >/dev/null 2>&1; then
  exec dspark start "$@"
else
  exec python3 -m dspark_launch start "$@"
fi
