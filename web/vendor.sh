#!/usr/bin/env bash
# Copies the web view's JavaScript libraries from web/node_modules (installed
# with `npm ci` from the committed package-lock.json) into web/vendor/, the
# files the binary embeds (src/agent/page/assets.rs). Run after changing a version
# in package.json (`npm install`), then commit web/vendor/ and the lock file.
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules/uplot ] || npm ci --no-audit --no-fund
cp node_modules/uplot/dist/uPlot.iife.min.js vendor/uPlot.iife.min.js
cp node_modules/uplot/dist/uPlot.min.css vendor/uPlot.min.css
cp node_modules/uplot/LICENSE vendor/uPlot.LICENSE
