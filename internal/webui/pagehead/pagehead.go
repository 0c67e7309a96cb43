// Package pagehead holds what every HTML page the broker serves sends
// besides its content: the security headers and the icon. The web UI and
// the sign-in page (internal/auth) both use it, so that a page served by
// either is framed by nobody, runs no script from elsewhere and shows the
// same icon.
package pagehead

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
)

// Icon is where the pages' icon is, among the web UI's static files, for
// <link rel="icon" href="{{.}}"> (a page without one makes the browser ask
// for /favicon.ico, a 404).
const Icon = "/static/icon.svg"

// Set sets the security headers of an HTML page on h: no sniffing, no
// framing, the referrer only to this site, and a Content-Security-Policy
// that allows scripts, styles, images and connections from this site only.
// inlineStyles are the texts of the page's own <style> elements, exactly
// as written between the tags; each is allowed by its hash, and nothing
// else inline is.
func Set(h http.Header, inlineStyles ...string) {
	style := "style-src 'self'"
	for _, s := range inlineStyles {
		sum := sha256.Sum256([]byte(s))
		style += " 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", strings.Join([]string{
		"default-src 'self'", "img-src 'self' data:", style, "script-src 'self'", "connect-src 'self'",
		"frame-ancestors 'none'", "base-uri 'none'", "form-action 'self'",
	}, "; "))
}
