package tracing_test

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/assent-dev/assent/internal/tracing"
)

// clearEnv unsets the OTEL_* variables Config reads for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{tracing.EnvEndpoint, tracing.EnvTracesEndpoint, tracing.EnvDisabled} {
		t.Setenv(k, "")
	}
}

func TestRegisterFlags(t *testing.T) {
	clearEnv(t)
	var c tracing.Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	tracing.RegisterFlags(fs, &c)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "" || c.SampleRatio != 1 || c.Enabled() {
		t.Fatalf("defaults %+v (enabled %v), want off with a sample ratio of 1", c, c.Enabled())
	}
	if err := fs.Parse([]string{"--otlp-endpoint", "http://collector:4318", "--trace-sample", "0.25"}); err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "http://collector:4318" || c.SampleRatio != 0.25 || !c.Enabled() {
		t.Fatalf("parsed %+v (enabled %v)", c, c.Enabled())
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    tracing.Config
		want []string // parts of the error; none: valid
	}{
		{"off", tracing.Config{}, nil},
		{"http", tracing.Config{Endpoint: "http://collector:4318", SampleRatio: 1}, nil},
		{"https with a path", tracing.Config{Endpoint: "https://otel.example.com/otlp/v1/traces", SampleRatio: 0}, nil},
		{"host and port only", tracing.Config{Endpoint: "collector:4318", SampleRatio: 1}, []string{"--otlp-endpoint", "http://collector:4318"}},
		{"grpc scheme", tracing.Config{Endpoint: "grpc://collector:4317", SampleRatio: 1}, []string{"--otlp-endpoint"}},
		{"no host", tracing.Config{Endpoint: "http://", SampleRatio: 1}, []string{"--otlp-endpoint"}},
		{"ratio above 1", tracing.Config{SampleRatio: 1.5}, []string{"--trace-sample"}},
		{"every problem at once", tracing.Config{Endpoint: "collector", SampleRatio: -1}, []string{"--otlp-endpoint", "--trace-sample"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestEnabledByEnvironment: the standard variables turn tracing on without
// the flag, and OTEL_SDK_DISABLED turns it off whatever else says.
func TestEnabledByEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		endpoint string
		want     bool
	}{
		{"nothing", nil, "", false},
		{"endpoint variable", map[string]string{tracing.EnvEndpoint: "http://c:4318"}, "", true},
		{"traces endpoint variable", map[string]string{tracing.EnvTracesEndpoint: "http://c:4318/v1/traces"}, "", true},
		{"flag", nil, "http://c:4318", true},
		{"disabled", map[string]string{tracing.EnvDisabled: "true", tracing.EnvEndpoint: "http://c:4318"}, "http://c:4318", false},
		{"disabled false", map[string]string{tracing.EnvDisabled: "false"}, "http://c:4318", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := (tracing.Config{Endpoint: tc.endpoint, SampleRatio: 1}).Enabled(); got != tc.want {
				t.Errorf("Enabled() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOffIsNoop: off, New gives a no-op provider and Start leaves the
// global provider alone.
func TestOffIsNoop(t *testing.T) {
	clearEnv(t)
	before := otel.GetTracerProvider()
	p, err := tracing.New(context.Background(), tracing.Config{SampleRatio: 1}, "broker", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.TracerProvider.(noop.TracerProvider); !ok || p.Endpoint != "" {
		t.Fatalf("off: provider %T for %q, want a no-op", p.TracerProvider, p.Endpoint)
	}
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Error(err)
	}
	stop, err := tracing.Start(context.Background(), tracing.Config{SampleRatio: 1}, "broker", nil)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	stop() // twice is fine
	if otel.GetTracerProvider() != before {
		t.Error("Start with tracing off replaced the global provider")
	}
	if _, err := tracing.New(context.Background(), tracing.Config{Endpoint: "collector:4318"}, "broker", nil); err == nil {
		t.Error("New took an endpoint without a scheme")
	}
}

// TestExportOnShutdown: on, spans reach the collector at the endpoint's
// /v1/traces, as protobuf, by Shutdown at the latest.
func TestExportOnShutdown(t *testing.T) {
	clearEnv(t)
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || len(body) == 0 {
			t.Errorf("export to %s as %q, %d bytes; want protobuf to /v1/traces", r.URL.Path, r.Header.Get("Content-Type"), len(body))
		}
		posts.Add(1)
	}))
	defer srv.Close()
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: srv.URL, SampleRatio: 1}, "broker", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer("test").Start(context.Background(), "work")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if posts.Load() == 0 {
		t.Fatal("no span reached the collector")
	}
}
