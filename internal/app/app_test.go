package app_test

import (
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
)

// TestHTTPServesLoopbackOnlyWithoutAuth: without authentication the HTTP API
// may only listen where nobody but this machine reaches it; a start on any
// other address is refused, naming the fix.
func TestHTTPServesLoopbackOnlyWithoutAuth(t *testing.T) {
	base := app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir()}
	for _, addr := range []string{"127.0.0.1:8080", "[::1]:8080", "localhost:8080", "127.0.0.2:0"} {
		o := base
		o.HTTPListen = addr
		if err := o.Validate(); err != nil {
			t.Errorf("%s without auth: %v", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080", "10.1.2.3:8080", "example.com:80"} {
		o := base
		o.HTTPListen = addr
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "--auth") || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%s without auth: %v, want a refusal naming --auth", addr, err)
		}
		o.AuthFile = "auth.yaml"
		if err := o.Validate(); err != nil {
			t.Errorf("%s with auth: %v", addr, err)
		}
	}
}
