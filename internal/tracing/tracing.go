// Package tracing turns OpenTelemetry tracing on for Assent's programs: the
// flags that configure it, and the tracer provider that exports spans over
// OTLP/HTTP. It is off unless an OTLP endpoint is given; off, the programs
// use a no-op tracer and export nothing.
//
// The spans themselves are made where the work is (pkg/handler, the broker,
// the HTTP API, the channels) through the OpenTelemetry API alone, and the
// trace context travels between programs in the CloudEvents traceparent and
// tracestate attributes of the events (docs/tracing.md).
package tracing

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"
)

// The standard OpenTelemetry environment variables that Config reads besides
// its own fields. The OTLP exporter reads the rest of its settings from the
// OTEL_EXPORTER_OTLP_* variables itself (headers, timeout, compression,
// certificates), and the resource from OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES.
const (
	// EnvEndpoint and EnvTracesEndpoint turn tracing on when no endpoint
	// is configured otherwise: the exporter sends to the collector they
	// name.
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// EnvDisabled set to "true" turns tracing off, whatever else says.
	EnvDisabled = "OTEL_SDK_DISABLED"
)

// Config configures tracing. The zero value is off.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's URL, "http://collector:4318"
	// (plain HTTP) or "https://collector:4318" (TLS, trusting the system's
	// CAs or OTEL_EXPORTER_OTLP_CERTIFICATE); spans go to its /v1/traces
	// unless the URL has a path of its own. Empty, tracing is off unless
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is
	// set.
	Endpoint string
	// SampleRatio is the fraction of traces begun here that are recorded,
	// from 0 to 1; a trace begun upstream (an agent's own) is recorded
	// when its parent was. RegisterFlags defaults it to 1.
	SampleRatio float64
}

// RegisterFlags registers the tracing flags on fs, filling c; its
// SampleRatio starts at 1.
func RegisterFlags(fs *flag.FlagSet, c *Config) {
	c.SampleRatio = 1
	fs.StringVar(&c.Endpoint, "otlp-endpoint", c.Endpoint, "send OpenTelemetry traces over OTLP/HTTP to the collector at this `URL` (http://host:4318, or https:// for TLS); off when empty, unless OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/tracing.md)")
	fs.Float64Var(&c.SampleRatio, "trace-sample", c.SampleRatio, "with tracing on, the `ratio` of new traces recorded, 0 to 1; traces begun by an agent follow the agent's choice")
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--otlp-endpoint %q: %w", c.Endpoint, err))
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			errs = append(errs, fmt.Errorf("--otlp-endpoint %q: want a URL such as http://collector:4318 (https:// for TLS)", c.Endpoint))
		}
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		errs = append(errs, fmt.Errorf("--trace-sample %v: want a ratio from 0 to 1", c.SampleRatio))
	}
	return errors.Join(errs...)
}

// Enabled reports whether c, with the environment, turns tracing on.
func (c Config) Enabled() bool {
	if disabled, _ := strconv.ParseBool(os.Getenv(EnvDisabled)); disabled {
		return false
	}
	return c.Endpoint != "" || os.Getenv(EnvTracesEndpoint) != "" || os.Getenv(EnvEndpoint) != ""
}

// Provider is a TracerProvider with its Shutdown.
type Provider struct {
	trace.TracerProvider
	// Endpoint is where spans go; empty when tracing is off.
	Endpoint string
	shutdown func(context.Context) error
	once     sync.Once
	err      error
}

// Shutdown exports the spans still buffered and stops the exporter, within
// ctx; it is safe to call twice, and does nothing when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.once.Do(func() {
		if p.shutdown != nil {
			p.err = p.shutdown(ctx)
		}
	})
	return p.err
}

// ForceFlush exports the spans that ended and are still buffered, within
// ctx; it does nothing when tracing is off.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if f, ok := p.TracerProvider.(interface{ ForceFlush(context.Context) error }); ok {
		return f.ForceFlush(ctx)
	}
	return nil
}

// New returns the tracer provider cfg asks for, whose spans name service
// (the resource's service.name, unless OTEL_SERVICE_NAME says otherwise):
// an OTLP/HTTP exporter behind a batching span processor, or a no-op
// provider when tracing is off. It does not install it as OpenTelemetry's
// global provider; Start does. A nil log logs nothing.
func New(ctx context.Context, cfg Config, service string, log *zap.Logger) (*Provider, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	var opts []otlptracehttp.Option
	endpoint := cfg.Endpoint
	if endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	} else if endpoint = os.Getenv(EnvTracesEndpoint); endpoint == "" {
		endpoint = os.Getenv(EnvEndpoint)
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w (check --otlp-endpoint and the OTEL_EXPORTER_OTLP_* variables)", endpoint, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost())
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w (check OTEL_RESOURCE_ATTRIBUTES)", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
	log.Info("tracing on: exporting spans over OTLP/HTTP", zap.String("endpoint", endpoint),
		zap.String("service", service), zap.Float64("sample", cfg.SampleRatio))
	return &Provider{TracerProvider: tp, Endpoint: endpoint, shutdown: tp.Shutdown}, nil
}

// Start is New that also installs the provider as OpenTelemetry's global one
// when tracing is on, with the W3C Trace Context and Baggage propagators,
// and sends OpenTelemetry's own errors (a collector that cannot be reached)
// to log. What uses the global provider (pkg/handler, unless its
// configuration names a provider) then records spans. Call the returned
// func before exiting: it exports what is buffered, waiting at most 5
// seconds.
func Start(ctx context.Context, cfg Config, service string, log *zap.Logger) (shutdown func(), err error) {
	p, err := New(ctx, cfg, service, log)
	if err != nil {
		return nil, err
	}
	if p.Endpoint != "" {
		otel.SetTracerProvider(p)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
		if log != nil {
			otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
				log.Warn("tracing: cannot export spans; check that the collector is up and --otlp-endpoint", zap.Error(err))
			}))
		}
	}
	return func() { Stop(p, log) }, nil
}

// Stop shuts p down, waiting at most 5 seconds for its last spans to be
// exported, and logs a failure.
func Stop(p *Provider, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil && log != nil {
		log.Warn("tracing: the last spans were not exported", zap.String("endpoint", p.Endpoint), zap.Error(err))
	}
}

// Service names of Assent's programs, as their spans carry them.
const (
	ServiceBroker      = "broker"
	ServiceApproverBot = "approver-bot"
	ServiceAgentWorker = "agent-worker"
	ServiceMCPGateway  = "mcp-gateway"
)
