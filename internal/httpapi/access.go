package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/assent-dev/assent/internal/access"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/policy"
)

// Who sees what (docs/web.md, "Who sees what") is package access's to
// decide, for the web UI's pages too; these are its questions as the
// gateway asks them.

// caller is who calls, as the gateway authorizes it.
type caller struct {
	Identity
	// open: authentication is off, and every caller sees everything.
	open bool
}

// caller returns who calls r.
func (s *Server) caller(r *http.Request) caller {
	if s.cfg.Identify == nil {
		return caller{open: true}
	}
	id, _ := s.cfg.Identify(r)
	return caller{Identity: id}
}

// access is c as package access knows callers.
func (c caller) access() access.Caller {
	return access.Caller{Principal: c.Principal, Agent: c.Agent, Admin: c.Admin, Open: c.open}
}

// all reports whether c sees every request.
func (c caller) all() bool { return c.access().All() }

// agentOnly reports whether c sees its own agent's requests and nothing
// else.
func (c caller) agentOnly() bool { return c.access().AgentOnly() }

// sees reports whether c may read rec.
func (s *Server) sees(c caller, rec broker.Record) bool { return access.Sees(s.b, c.access(), rec) }

// mayRevoke reports whether c may revoke (and so see) remembered choice g.
func (s *Server) mayRevoke(c caller, g policy.Grant) bool {
	return access.MayRevoke(s.b, c.access(), g)
}

// visibility remembers, for one listing or one event stream, whether c sees
// each request.
func (s *Server) visibility(c caller) *access.Visibility {
	return access.NewVisibility(s.b, c.access())
}

// listFor lists the requests matching f that c sees.
func (s *Server) listFor(ctx context.Context, c caller, f broker.Filter) (broker.Page, error) {
	return access.List(ctx, s.b, c.access(), f)
}

// agentScope narrows an agent-only caller's agent filter to its own agent:
// asking for another agent's is 403 agent_mismatch. It returns the agents to
// filter by (nil: any) and false when it wrote the error.
func agentScope(w http.ResponseWriter, c caller, asked []string) ([]string, bool) {
	if !c.agentOnly() {
		return asked, true
	}
	for _, a := range asked {
		if a != c.Agent {
			writeError(w, http.StatusForbidden, "agent_mismatch", fmt.Sprintf("this credential reads agent %q's requests, not %q's (docs/web.md, \"Who sees what\")", c.Agent, a))
			return nil, false
		}
	}
	if c.Agent == "" {
		writeError(w, http.StatusForbidden, "no_principal", "this credential names neither a principal nor an agent, so it sees no request")
		return nil, false
	}
	return []string{c.Agent}, true
}
