#!/usr/bin/env bash
# Installs the sources of the emoji dataset (`aoq data emoji`) when they are missing:
#   Debian fonts-noto-color-emoji  Noto Color Emoji font (artwork, OFL 1.1)
#   Debian unicode-cldr-core       CLDR English annotations (short names, keywords)
#   Debian unicode-data            emoji-test.txt (the emoji list, groups) and UnicodeData.txt (names)
#   Debian libcairo2               the cairo library that the cairosvg wheel loads
#   npm    @twemoji/svg (pinned)   Twemoji SVG artwork (CC-BY 4.0), into .cache/twemoji
# Fast and silent when everything is present; nothing else is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
TWEMOJI_VERSION="${TWEMOJI_VERSION:-15.0.0}"
TWEMOJI_PREFIX="${AOQ_TWEMOJI_DIR:-.cache/twemoji}"

need=()
for pkg in fonts-noto-color-emoji unicode-cldr-core unicode-data libcairo2; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "data-deps: missing Debian packages ${need[*]}; install them with: apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "data-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Update the package lists only when the install cannot find a candidate without it.
  apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  }
fi

marker="$TWEMOJI_PREFIX/node_modules/@twemoji/svg/package.json"
if ! { [ -f "$marker" ] && grep -q "\"version\": \"$TWEMOJI_VERSION\"" "$marker"; }; then
  command -v npm >/dev/null 2>&1 || { echo "data-deps: npm is needed to install @twemoji/svg (Debian: apt-get install npm)" >&2; exit 1; }
  echo "data-deps: installing @twemoji/svg@$TWEMOJI_VERSION into $TWEMOJI_PREFIX"
  mkdir -p "$TWEMOJI_PREFIX"
  npm install --prefix "$TWEMOJI_PREFIX" --no-audit --no-fund --silent "@twemoji/svg@$TWEMOJI_VERSION" >/dev/null
fi
