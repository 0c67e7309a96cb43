// Package browser holds the web UI's end-to-end tests in headless Chromium
// (skipped without it) and the web benchmarks.
//
// Its helpers are shared with the other end-to-end packages in
// integration/itest (see package integration).
package browser
