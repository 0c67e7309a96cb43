// Package pagehead holds what every HTML page the broker serves sends
// besides its content: the security headers and the icon. The web UI and
// the sign-in page (internal/auth) both use it, so that a page served by
// either is framed by nobody, runs no script from elsewhere and shows the
// same icon.
package pagehead

import (
	"crypto/sha256"
	"encoding/base64"
	"html/template"
	"net/http"
	"strings"
)

// Icon is the pages' icon, a data: URL (no request, so no 404 in the
// console), for <link rel="icon" href="{{.}}">.
const Icon template.URL = "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E%3Crect width='16' height='16' rx='4' fill='%232f5bd3'/%3E%3Cpath d='M4 8.5l2.5 2.5L12 5.5' stroke='white' stroke-width='2' fill='none'/%3E%3C/svg%3E"

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
