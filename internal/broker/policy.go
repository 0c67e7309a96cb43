package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// builtinPolicy is the policy of a broker started without a policy file: the
// mode decides, anyone may approve (the requester too), answers may be
// remembered, and a request may ask for any timeout up to MaxTimeout.
func builtinPolicy(c Config) (*policy.Policy, error) {
	src := fmt.Sprintf("version: 1\nmode: %s\ndefaults:\n  timeout: %s\n  allow_self_approval: true\n", c.Mode, c.DefaultTimeout)
	return policy.Parse([]byte(src), "built-in policy")
}

// Policy returns the policy in force.
func (b *Broker) Policy() *policy.Policy { return b.pol.Load() }

// SetPolicy replaces the policy in force for new requests and answers. Pending
// requests keep their rule by name; one whose rule is gone falls back to the
// new policy's mode.
func (b *Broker) SetPolicy(p *policy.Policy) {
	if p == nil {
		return
	}
	b.pol.Store(p)
	b.custom.Store(true)
	b.log.Info("policy in force", zap.String("file", p.File), zap.Int("rules", len(p.Rules)), zap.String("mode", string(p.Mode)))
}

// approvalFor returns the approval requirements of a pending record under the
// current policy: its rule's, or the mode's.
func (b *Broker) approvalFor(r *Record) *policy.Approval {
	p := b.Policy()
	for _, rule := range p.Rules {
		if rule.Name == r.Rule && rule.Approval != nil {
			return rule.Approval
		}
	}
	return p.ModeApproval()
}

// RuleInputSchema is the rule of a decision that denied a request at once
// because its args break its own input_schema (or the schema cannot check
// them): nobody is asked to approve a call the tool would refuse.
const RuleInputSchema = "input-schema"

// evaluate applies the policy to a new record whose request's args have
// argsDigest: it sets the record's rule and deadline, and decides it at once
// when the policy says so. A request whose args break its input_schema is
// denied before the policy is asked (RuleInputSchema).
func (b *Broker) evaluate(ctx context.Context, r *Record, argsDigest string, now time.Time) error {
	if err := events.CheckArgs(r.Request.InputSchema, r.Request.Args); err != nil {
		r.Rule, r.Deadline = RuleInputSchema, r.ReceivedAt
		return r.decide(verdict{outcome: events.Denied, reason: inputSchemaReason(err), rule: RuleInputSchema, auto: true, at: now, digest: argsDigest})
	}
	in := policy.InputWithDigest(r.Request, argsDigest)
	rem := &grantReader{ctx: ctx, b: b}
	res := b.Policy().Evaluate(in, now, rem)
	if rem.err != nil {
		return rem.err
	}
	for _, cerr := range res.Errors {
		b.log.Warn("policy condition failed; applied fail-closed", zap.String("request_id", r.ID), zap.String("tool", r.Request.Tool), zap.Error(cerr))
	}
	if shadow := b.shadow.Load(); shadow != nil {
		b.compareShadow(ctx, r, in, res, shadow.Evaluate(in, now, rem))
	}
	if res.Action == policy.Allow && len(res.Limits) > 0 {
		var err error
		if res, err = b.charge(ctx, res, in, now); err != nil {
			return err
		}
	}
	timeout := b.cfg.clamp(r.Request.Timeout.Std())
	if res.Approval != nil && b.custom.Load() {
		timeout = b.cfg.clamp(res.Approval.TimeoutFor(r.Request.Timeout.Std()))
	}
	r.Deadline = r.ReceivedAt.Add(timeout).UTC()
	r.Rule, r.Limit = res.Rule, res.Limit
	if res.Approval != nil {
		r.Rule = res.Approval.Rule
		r.Approvers = res.Approval.Approvers
		r.Quorum = res.Approval.Quorum
		r.BaseDeadline = r.Deadline
	}
	if !now.Before(r.Deadline) {
		return r.decide(verdict{outcome: events.Expired, reason: "deadline passed before the broker saw the request", rule: r.Rule, auto: true, at: now, digest: in.ArgsDigest})
	}
	if res.Action == policy.RequireApproval && res.Approval.OnNoApprover == policy.NoApproverDeny && !res.Approval.Reachable(in, b.presence) {
		return r.decide(verdict{outcome: events.Denied, reason: policy.ReasonNoApprover, rule: r.Rule, auto: true, at: now, digest: in.ArgsDigest})
	}
	reason := res.Reason
	if res.Grant != nil {
		reason = fmt.Sprintf("remembered choice %s by %s until %s", res.Grant.ID, res.Grant.CreatedBy, res.Grant.ExpiresAt.Format(time.RFC3339))
	}
	switch res.Action {
	case policy.Allow:
		if reason == "" {
			reason = "allowed by " + res.Rule
		}
		return r.decide(verdict{outcome: events.Approved, reason: reason, rule: res.Rule, auto: true, at: now, digest: in.ArgsDigest})
	case policy.Deny:
		if reason == "" {
			reason = "denied by " + res.Rule
		}
		return r.decide(verdict{outcome: events.Denied, reason: reason, rule: res.Rule, auto: true, at: now, digest: in.ArgsDigest})
	}
	return nil
}

// inputSchemaReason is the reason of a denial by RuleInputSchema, err
// being what events.CheckArgs found.
func inputSchemaReason(err error) string {
	var fe *events.FieldError
	if errors.As(err, &fe) && fe.Field == "input_schema" {
		return "input_schema cannot check the args: " + truncate(err.Error(), 512)
	}
	return "the args break the request's input_schema: " + truncate(err.Error(), 512)
}

// SetShadow replaces the shadow policy; nil turns shadow mode off.
func (b *Broker) SetShadow(p *policy.Policy) { b.shadow.Store(p) }

// compareShadow records where the shadow policy would have decided r otherwise.
func (b *Broker) compareShadow(ctx context.Context, r *Record, in policy.Input, live, shadow policy.Result) {
	for _, cerr := range shadow.Errors {
		b.log.Debug("shadow policy condition failed", zap.String("request_id", r.ID), zap.Error(cerr))
	}
	differ, summary := policy.Diff(live, shadow)
	if !differ {
		return
	}
	b.metrics.nShadow.Add(1)
	b.log.Info("shadow policy disagrees", zap.String("request_id", r.ID), zap.String("tool", in.Tool), zap.String("summary", summary))
	e, err := events.New(events.TypeShadowDisagreement, "", b.source, events.ShadowDisagreement{
		RequestID: r.ID, Tool: in.Tool, Agent: in.Agent,
		Live: string(live.Action) + " by " + live.Rule, Shadow: string(shadow.Action) + " by " + shadow.Rule, Summary: summary,
	})
	if err != nil {
		return
	}
	msg, err := b.encode(events.ShadowPrefix+r.ID, &e)
	if err != nil {
		return
	}
	if _, err := b.publish(ctx, msg, jetstream.WithMsgID("shadow-"+r.ID)); err != nil {
		b.log.Warn("record shadow disagreement", zap.String("request_id", r.ID), zap.Error(err))
	}
}

// RuleInfo says how a request is decided under the policy in force.
type RuleInfo struct {
	// Rule is the rule whose approvers answer (or "mode:<mode>"); Limit the
	// limit that held an automatic approval back, if one did.
	Rule              string
	Limit             string
	Approvers         []string // as written: names and role:<role>; empty means anyone
	Quorum            int
	AllowSelfApproval bool
	OnTimeout         events.Verdict
	// Rememberable says whether answers may be remembered, in RememberScopes
	// for at most MaxRemember.
	Rememberable   bool
	RememberScopes []string
	MaxRemember    time.Duration
}

// RuleOf describes how r is decided under the policy in force.
func (b *Broker) RuleOf(r Record) RuleInfo {
	a := b.approvalFor(&r)
	return RuleInfo{
		Rule: r.Rule, Limit: r.Limit, Approvers: r.Approvers, Quorum: max(r.Quorum, a.Quorum, 1),
		AllowSelfApproval: a.AllowSelfApproval, OnTimeout: a.OnTimeout,
		Rememberable: a.Rememberable, RememberScopes: a.RememberScopes, MaxRemember: a.MaxRemember,
	}
}

// terms tells approver channels how r may be answered.
func (b *Broker) terms(r *Record) *events.Terms {
	info := b.RuleOf(*r)
	t := &events.Terms{Quorum: info.Quorum, AllowSelfApproval: info.AllowSelfApproval}
	if info.Rememberable {
		t.Remember = &events.RememberTerms{Scopes: info.RememberScopes, MaxTTL: events.Duration(info.MaxRemember)}
	}
	return t
}

// CheckEligible reports whether principal may answer request id under the
// policy in force: nil, or an error wrapping ErrNotEligible (or ErrNotFound).
func (b *Broker) CheckEligible(ctx context.Context, id, principal string) error {
	rec, err := b.load(ctx, id)
	if err != nil {
		return err
	}
	return b.Eligible(rec, principal)
}

// Eligible reports whether principal may answer r under the policy in force,
// as CheckEligible does, for a record already at hand.
func (b *Broker) Eligible(r Record, principal string) error {
	in, err := policy.InputFrom(r.Request)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := b.approvalFor(&r).Eligible(principal, in); err != nil {
		return fmt.Errorf("%w: %s may not answer %s: %w", ErrNotEligible, principal, r.ID, err)
	}
	return nil
}
