package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

func TestLoadAutoApprove(t *testing.T) {
	e := newEnv(t, broker.ModeAutoApprove, "load")
	res, err := worker.Load(testCtx(t), e.client, worker.LoadConfig{N: 200, Concurrency: 8, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 200 || res.Decided != 200 || res.Errors != 0 || res.Concurrency != 8 {
		t.Fatalf("result %+v", res)
	}
	if len(res.Outcomes) != 1 || res.Outcomes[events.Approved] != 200 {
		t.Fatalf("outcomes %v, want 200 approved", res.Outcomes)
	}
	l := res.Latency
	if l.Min <= 0 || l.Min > l.P50 || l.P50 > l.P95 || l.P95 > l.P99 || l.P99 > l.Max || res.Throughput <= 0 {
		t.Fatalf("latency %+v, throughput %v: not ordered", l, res.Throughput)
	}
	stats := e.b.Stats()
	if stats.Requested < 200 {
		t.Fatalf("broker saw %d requests", stats.Requested)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Decided  int                `json:"decided"`
		Outcomes map[string]int     `json:"outcomes"`
		Latency  map[string]float64 `json:"latency_ms"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Decided != 200 || out.Outcomes["approved"] != 200 || out.Latency["p99"] <= 0 {
		t.Fatalf("JSON %s: %v", b, err)
	}
}

func TestLoadCountsErrors(t *testing.T) {
	req := &fakeRequester{decide: func(r handler.Request) (handler.Decision, error) {
		switch r.CallID {
		case "1", "2":
			return handler.Decision{}, handler.ErrNoDecision
		case "3":
			return handler.Decision{}, errors.New("boom")
		case "4":
			return decision(r, events.Denied, ""), nil
		}
		return decision(r, events.Approved, ""), nil
	}}
	res, err := worker.Load(context.Background(), req, worker.LoadConfig{N: 10, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 10 || res.Decided != 7 || res.Errors != 3 || res.ErrorKinds["no_decision"] != 2 || res.ErrorKinds["other"] != 1 || res.FirstError == "" {
		t.Fatalf("result %+v", res)
	}
	if res.Outcomes[events.Approved] != 6 || res.Outcomes[events.Denied] != 1 {
		t.Fatalf("outcomes %v", res.Outcomes)
	}
	if len(req.asked) != 10 {
		t.Fatalf("%d requests sent", len(req.asked))
	}
	seen := map[string]bool{}
	for _, r := range req.asked {
		if r.Tool != "load_test" || r.Timeout.Std() != 30*time.Second || seen[r.CallID] {
			t.Fatalf("request %+v", r)
		}
		seen[r.CallID] = true
	}
}

func TestLoadStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	req := &fakeRequester{decide: func(r handler.Request) (handler.Decision, error) {
		if r.CallID == "5" {
			cancel()
		}
		return decision(r, events.Approved, ""), nil
	}}
	res, err := worker.Load(ctx, req, worker.LoadConfig{N: 1000, Concurrency: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Load: %v", err)
	}
	if res.Sent != 5 || res.Decided != 5 {
		t.Fatalf("result %+v", res)
	}
}

func TestLoadConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  worker.LoadConfig
		ok   bool
	}{
		{"defaults", worker.LoadConfig{N: 1}, true},
		{"no requests", worker.LoadConfig{}, false},
		{"negative concurrency", worker.LoadConfig{N: 1, Concurrency: -1}, false},
		{"negative timeout", worker.LoadConfig{N: 1, Timeout: -time.Second}, false},
		{"args not an object", worker.LoadConfig{N: 1, Args: json.RawMessage(`[1]`)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.WithDefaults().Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate: %v", err)
			}
			if !tt.ok {
				if _, err := worker.Load(context.Background(), &fakeRequester{}, tt.cfg); err == nil {
					t.Fatal("Load accepted a bad config")
				}
			}
		})
	}
	err := worker.LoadConfig{Concurrency: -1, Timeout: -1}.Validate()
	if err == nil || len(err.(interface{ Unwrap() []error }).Unwrap()) < 3 {
		t.Fatalf("Validate does not report every problem: %v", err)
	}
}
