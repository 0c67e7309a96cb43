package httpapi

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/assent-dev/assent/pkg/events"
)

// SpanDecision covers an answer given through POST /v1/approvals/{id}/decision
// or, one per request, POST /v1/decisions: a span in the request's trace
// (docs/tracing.md), which the recorded answer carries to the broker.
const SpanDecision = "assent.http.decision"

const tracerName = "github.com/assent-dev/assent/internal/httpapi"

// startDecision starts the span of principal's answer to request id, under
// the request's trace context. A W3C traceparent header of the HTTP request
// (the caller's own trace) becomes a link.
func (s *Server) startDecision(r *http.Request, id, principal string, resp events.Responded) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("assent.request_id", id), attribute.String("assent.principal", principal),
			attribute.String("assent.decision", string(resp.Decision)), attribute.String("assent.channel", resp.Channel),
			attribute.String("http.route", r.Pattern))}
	if sc := trace.SpanContextFromContext(callerTrace(r)); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return s.tracer.Start(s.b.RequestContext(r.Context(), id), SpanDecision, opts...)
}

// callerTrace returns the context of r carrying the trace context of its
// W3C traceparent and tracestate headers, when they are valid.
func callerTrace(r *http.Request) context.Context {
	return propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}

// endDecision ends a decision's span, marking it failed with err when err is
// not nil.
func endDecision(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}
