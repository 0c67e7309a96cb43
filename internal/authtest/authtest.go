// Package authtest puts the broker's real authentication in front of a
// handler in tests: an auth file of API tokens, loaded as the broker loads
// it, and its middleware.
package authtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
)

// Token is a credential of the auth file, as `broker token create` makes it.
type Token struct {
	Principal, Agent string
	Admin            bool
}

// New writes an auth file with a token of each name, and returns the
// tokens (by name, as a client sends them) and the authentication that
// checks them, its principals those of b's policy.
func New(t testing.TB, b *broker.Broker, tokens map[string]Token) (map[string]string, *auth.Authenticator) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, tok := range tokens {
		s, err := auth.CreateToken(path, name, tok.Principal, tok.Agent, tok.Admin, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		out[name] = s
	}
	cfg, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(context.Background(), cfg, path, auth.Options{Principals: func() auth.PrincipalResolver { return b.Policy() }, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return out, authn
}
