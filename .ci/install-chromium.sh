#!/bin/sh
# Install Debian's Chromium and its WebDriver, which tests/test_html.py drives headless (the
# HTML report loaded without console errors, a screenshot, mermaid's own parser).
set -eu
sh "$(dirname "$0")/apt-install.sh" install-chromium "/usr/bin/chromium /usr/bin/chromedriver" \
    chromium chromium-driver fonts-dejavu-core
