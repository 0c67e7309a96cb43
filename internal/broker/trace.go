package broker

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/assent-dev/assent/pkg/events"
)

// Tracing (docs/tracing.md). A request's trace is the one its requested
// event carries (the agent's), or a new one the ingest span begins. The
// broker's spans about a request join it: ingest under the requested event's
// trace context; an answer or a cancel under the event's own, or else the
// request's; an expiry under the request's. The request's trace context as the
// record keeps it is that of its ingest span, and every event the broker
// publishes carries the trace context of the span that published it.

// Span names of the broker.
const (
	// SpanIngest covers taking a requested event in: policy evaluation
	// (SpanEvaluate), then the automatic decision or the pending record and
	// its announcement.
	SpanIngest = "assent.broker.ingest"
	// SpanEvaluate covers evaluating the policy for a request.
	SpanEvaluate = "assent.broker.evaluate"
	// SpanAnswer covers applying an approver's answer.
	SpanAnswer = "assent.broker.answer"
	// SpanCancel covers applying a cancel.
	SpanCancel = "assent.broker.cancel"
	// SpanExpire covers a request's moment passing: its expiry, an
	// escalation step, or a timeout that approves.
	SpanExpire = "assent.broker.expire"
)

// tracerName names the broker's tracer (the instrumentation scope).
const tracerName = "github.com/assent-dev/assent/internal/broker"

// Attribute keys of the broker's spans.
const (
	attrRequestID = attribute.Key(events.SpanAttrRequestID)
	attrAgent     = attribute.Key(events.SpanAttrAgent)
	attrTool      = attribute.Key(events.SpanAttrTool)
	attrState     = attribute.Key(events.SpanAttrState)
	attrRule      = attribute.Key(events.SpanAttrRule)
	attrAuto      = attribute.Key(events.SpanAttrAuto)
	attrPrincipal = attribute.Key(events.SpanAttrPrincipal)
	attrDecision  = attribute.Key(events.SpanAttrDecision)
	attrLevel     = attribute.Key(events.SpanAttrLevel)
	attrReplica   = attribute.Key(events.SpanAttrReplica)
)

// maxTraceState bounds the tracestate a record keeps: W3C Trace Context asks
// to propagate at least 512 characters of it, and a longer one is dropped
// rather than stored with every request.
const maxTraceState = 512

// traceContext reads and writes the events' traceparent and tracestate.
var traceContext propagation.TraceContext

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// eventContext returns ctx carrying e's trace context, when it has a valid
// one; a malformed one is ignored.
func eventContext(ctx context.Context, e *events.Event) context.Context {
	return traceContext.Extract(ctx, events.TraceCarrier{Event: e})
}

// setEventTrace writes the span context of ctx into e, when it has one.
func setEventTrace(ctx context.Context, e *events.Event) {
	traceContext.Inject(ctx, events.TraceCarrier{Event: e})
}

// setTrace keeps in r the trace context of ctx: the request's.
func (r *Record) setTrace(ctx context.Context) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	m := propagation.MapCarrier{}
	traceContext.Inject(ctx, m)
	r.TraceParent, r.TraceState = m[events.TraceParentAttribute], m[events.TraceStateAttribute]
	if len(r.TraceState) > maxTraceState {
		r.TraceState = ""
	}
}

// traceContext returns ctx carrying r's trace context, if it keeps one.
func (r *Record) traceContext(ctx context.Context) context.Context {
	return withTrace(ctx, r.TraceParent, r.TraceState)
}

// withTrace returns ctx carrying the trace context parent and state name
// (W3C traceparent and tracestate), ctx itself when parent is empty.
func withTrace(ctx context.Context, parent, state string) context.Context {
	if parent == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{events.TraceParentAttribute: parent, events.TraceStateAttribute: state})
}

// RequestContext returns ctx carrying request id's trace context, when ctx
// carries none and the request is known: for the spans of programs that act
// on a request by its id (the HTTP gateway).
func (b *Broker) RequestContext(ctx context.Context, id string) context.Context {
	if !events.ValidToken(id) {
		return ctx
	}
	return b.requestContext(ctx, id)
}

// requestContext returns ctx carrying request id's trace context, when ctx
// carries none: from the record this replica knows, else read from the
// bucket (which the transition that follows then starts from).
func (b *Broker) requestContext(ctx context.Context, id string) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	if parent, state, ok := b.ledger.traceOf(id); ok { // a cold request keeps its trace context
		return withTrace(ctx, parent, state)
	}
	if rec, _, ok := b.index.getDecided(id); ok {
		return rec.traceContext(ctx)
	}
	return ctx
}

// startSpan starts one of the broker's spans about request id.
func (b *Broker) startSpan(ctx context.Context, name string, kind trace.SpanKind, id string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if _, off := b.tracer.(noop.Tracer); off {
		// Tracing off (the programs' default): the span only carries the
		// request's trace context on; its options would be built for
		// nothing, for every decision.
		return b.tracer.Start(ctx, name)
	}
	return b.tracer.Start(ctx, name, trace.WithSpanKind(kind),
		trace.WithAttributes(append(attrs, attrRequestID.String(id), attrReplica.String(b.cfg.Name))...))
}

// endSpan ends span with what rec became, marking it failed with err when
// err is not nil.
func endSpan(span trace.Span, rec *Record, err error) {
	if span.IsRecording() && rec != nil && rec.ID != "" {
		span.SetAttributes(attrState.String(string(rec.State)), attrRule.String(rec.Rule))
		if rec.Decision != nil {
			span.SetAttributes(attrAuto.Bool(rec.Decision.Auto))
		}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
