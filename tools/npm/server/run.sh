#!/usr/bin/env bash
# The server's end-to-end tests (the official openai npm client, headless Chromium through
# puppeteer-core) against `minfer serve`: tools/npm/server/run.sh PATH_TO_MINFER. Exit 77 (a
# skip, with the reason printed) only when node or the npm packages are missing; scripts/deps
# installs both.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "SKIP: node is not installed (scripts/deps installs it)"; exit 77; }
for pkg in openai puppeteer-core; do
  [ -d "$here/../node_modules/$pkg" ] || { echo "SKIP: npm package $pkg is missing (scripts/deps installs it)"; exit 77; }
done
export MINFER_BINARY=$1
exec node --test --test-concurrency=1 "$here"/*.test.mjs
