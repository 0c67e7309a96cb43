package handler

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/assent-dev/assent/pkg/events"
)

// Tracing: the SDK's spans (docs/tracing.md lists them all). Each runtime
// uses the TracerProvider its configuration names, or OpenTelemetry's global
// one; without an SDK installed that is a no-op that still carries the
// caller's trace context into the events.

// Span names of the SDK.
const (
	// SpanRequest covers Client.Request, from publishing the requested
	// event to the decision: the agent's side of one approval.
	SpanRequest = "assent.request"
	// SpanApprove covers an Approver handling one pending request: its
	// Handler and the answer it publishes.
	SpanApprove = "assent.approver.handle"
	// SpanNotify covers a Channel showing a pending request (or a reminder)
	// to its people.
	SpanNotify = "assent.channel.notify"
	// SpanAnswer covers a Channel publishing a person's answer.
	SpanAnswer = "assent.channel.answer"
	// SpanResolve covers a Channel showing a request's outcome.
	SpanResolve = "assent.channel.resolve"
)

// tracerName names the SDK's tracer (the instrumentation scope).
const tracerName = "github.com/assent-dev/assent/pkg/handler"

// Attribute keys of the spans, shared with the broker's.
const (
	attrRequestID = attribute.Key(events.SpanAttrRequestID)
	attrAgent     = attribute.Key(events.SpanAttrAgent)
	attrTool      = attribute.Key(events.SpanAttrTool)
	attrOutcome   = attribute.Key(events.SpanAttrOutcome)
	attrRule      = attribute.Key(events.SpanAttrRule)
	attrAuto      = attribute.Key(events.SpanAttrAuto)
	attrPrincipal = attribute.Key(events.SpanAttrPrincipal)
	attrChannel   = attribute.Key(events.SpanAttrChannel)
	attrDecision  = attribute.Key(events.SpanAttrDecision)
	attrLevel     = attribute.Key(events.SpanAttrLevel)
	attrReminder  = attribute.Key(events.SpanAttrReminder)
)

// traceContext reads and writes the events' traceparent and tracestate.
var traceContext propagation.TraceContext

// newTracer returns the SDK's tracer from tp, or from the global provider.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// withEventTrace returns ctx carrying e's trace context when e has a valid
// one; a malformed one is ignored.
func withEventTrace(ctx context.Context, e *events.Event) context.Context {
	return traceContext.Extract(ctx, events.TraceCarrier{Event: e})
}

// eventTrace returns the span context e carries; invalid when none.
func eventTrace(e *events.Event) trace.SpanContext {
	return trace.SpanContextFromContext(withEventTrace(context.Background(), e))
}

// setEventTrace writes the span context of ctx into e, when it has one.
func setEventTrace(ctx context.Context, e *events.Event) {
	traceContext.Inject(ctx, events.TraceCarrier{Event: e})
}

// linkDecider links the span of ctx (Request's) to the broker's span that
// decided, whose span context the decided event carried as sc.
func linkDecider(ctx context.Context, sc trace.SpanContext) {
	if sc.IsValid() {
		trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: sc})
	}
}

// endSpan ends span, marking it failed with err when err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// decisionAttrs describe a decision on the span that waited for it.
func decisionAttrs(d Decision) []attribute.KeyValue {
	return []attribute.KeyValue{attrOutcome.String(string(d.Outcome)), attrRule.String(d.Rule), attrAuto.Bool(d.Auto)}
}
