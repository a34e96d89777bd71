// Package browser tests the httpidem middleware and its CORS helper from a
// real browser: headless Chromium (Debian's package; scripts/servers/
// chromium.sh installs it, IDEM_CHROMIUM names its binary) driven with
// chromedp. A page on one origin posts with an Idempotency-Key to an API
// on another origin, retries, and reads the replay marker from JavaScript.
package browser
