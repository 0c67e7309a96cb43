package itest

import (
	"testing"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

func Submit(t *testing.T, e *Env, req events.Requested) broker.Record {
	t.Helper()
	if req.Agent == "" {
		req.Agent = "pol"
	}
	rec, err := e.B.Submit(TestCtx(t, Patience), "", "agent/"+req.Agent, req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
