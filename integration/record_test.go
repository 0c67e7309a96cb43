package integration

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/pkg/events"
)

// TestChainedRecord: a broker with a decision key stores signed checkpoints
// of what it and everyone else stored; `broker audit verify` proves the live
// stream and a backup of it; a witness keeps the checkpoints; and once a
// message is deleted, verify exits 1 and says where.
func TestChainedRecord(t *testing.T) {
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	e := itest.NewEnv(t, broker.Config{Mode: broker.ModeManual, DecisionKey: key, CheckpointInterval: 100 * time.Millisecond})
	cli := func(args ...string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		code := app.CLI{Stdout: &out, Stderr: &out}.Run(itest.TestCtx(t, itest.Patience), args)
		return code, out.String()
	}

	// A witness from the start.
	witness := filepath.Join(t.TempDir(), "witness.jsonl")
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	witnessed := make(chan string, 1)
	go func() {
		var out bytes.Buffer
		code := app.CLI{Stdout: &out, Stderr: &out}.Run(wctx, []string{"audit", "witness", "--out", witness, "--every", "50ms",
			"--nats-url", e.NS.ClientURL(), "--trust-decision-key", pub})
		witnessed <- fmt.Sprintf("%d %s", code, out.String())
	}()

	var lastDecision events.Decided
	for range 5 {
		rec := itest.Submit(t, e, events.Requested{Tool: "deploy", Args: []byte(`{"v":1}`)})
		itest.AnswerNATS(t, e.JS, "alice", rec.ID, events.Responded{Decision: events.Approve})
		lastDecision = itest.WaitDecision(t, e.JS, rec.ID)
	}
	s, err := e.JS.Stream(itest.TestCtx(t, itest.Patience), broker.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	covered := func() (events.Checkpoint, bool) {
		info, err := s.Info(itest.TestCtx(t, itest.Patience))
		if err != nil {
			t.Fatal(err)
		}
		last, found, err := chain.LastCheckpoint(itest.TestCtx(t, itest.Patience), s)
		if err != nil {
			t.Fatal(err)
		}
		return last.Checkpoint, found && last.Seq == info.State.LastSeq
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, ok := covered(); !ok; _, ok = covered() {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint covers the stream")
		}
		time.Sleep(50 * time.Millisecond)
	}
	last, _ := covered()

	code, out := cli("audit", "verify", "--nats-url", e.NS.ClientURL(), "--trust-decision-key", pub)
	if code != 0 || !strings.Contains(out, "the record proves itself") || !strings.Contains(out, "decisions: 5, signed by a trusted key: 5") {
		t.Fatalf("verify, live: %d\n%s", code, out)
	}
	backup := filepath.Join(t.TempDir(), "backup")
	if _, err := app.Backup(itest.TestCtx(t, itest.Patience), e.NC, backup, "test", &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if code, out = cli("audit", "verify", "--backup", backup, "--trust-decision-key", pub); code != 0 || !strings.Contains(out, "the record proves itself") {
		t.Fatalf("verify, a backup: %d\n%s", code, out)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		kept, err := chain.ReadWitnessed(witness)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(kept); n > 0 && kept[n-1].Seq > last.Upto {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the witness kept %d checkpoints, none the last", len(kept))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, out = cli("audit", "verify", "--nats-url", e.NS.ClientURL(), "--trust-decision-key", pub, "--witness", witness); code != 0 {
		t.Fatalf("verify with the witness: %d\n%s", code, out)
	}

	// A holder of the broker's credentials deletes an answer.
	answer, err := s.GetLastMsgForSubject(itest.TestCtx(t, itest.Patience), events.ResponsePrefix+"alice.>")
	if err != nil {
		t.Fatal(err)
	}
	// The decision links to its request's history: its pending event and
	// the answer that decided it.
	if len(lastDecision.Trail) != 2 || lastDecision.Trail[1] != answer.Sequence || lastDecision.RequestSeq >= lastDecision.Trail[0] {
		t.Fatalf("the last decision's request_seq %d and trail %v; the answer is at %d", lastDecision.RequestSeq, lastDecision.Trail, answer.Sequence)
	}
	if err := s.DeleteMsg(itest.TestCtx(t, itest.Patience), answer.Sequence); err != nil {
		t.Fatal(err)
	}
	code, out = cli("audit", "verify", "--nats-url", e.NS.ClientURL(), "--trust-decision-key", pub, "--witness", witness)
	if code != 1 || !strings.Contains(out, "PROBLEM: the checkpoint at stream sequence") || !strings.Contains(out, "1 of the") ||
		!strings.Contains(out, fmt.Sprintf("followed stream sequence %d, which is gone: deleted", answer.Sequence)) {
		t.Fatalf("verify after a deletion: %d\n%s", code, out)
	}
	t.Logf("broker audit verify after a deletion:\n%s", out)
	stop()
	if got := <-witnessed; !strings.HasPrefix(got, "0 ") || !strings.Contains(got, "kept the checkpoint at stream sequence") {
		t.Fatalf("the witness: %s", got)
	}
}
