package replay

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Kind is how the outcome a replayed policy gives a request differs from
// the recorded one: what the policy would do, then what happened. A kind
// "allow" is an automatic approval, "deny" an automatic denial, "ask" a
// request that would wait for people.
type Kind string

// The kinds of change. Each recorded request has at most one.
const (
	// AllowWhatPeopleDenied: allowed without a person; a person denied it.
	AllowWhatPeopleDenied Kind = "allow-what-people-denied"
	// AllowWhatPeopleApproved: allowed without a person; a person approved it.
	AllowWhatPeopleApproved Kind = "allow-what-people-approved"
	// AllowWhatWasDenied: allowed; it was denied automatically.
	AllowWhatWasDenied Kind = "allow-what-was-denied"
	// AllowWhatWentUnanswered: allowed; it waited for people and nobody
	// decided it (it expired, was approved by its timeout, or was
	// cancelled).
	AllowWhatWentUnanswered Kind = "allow-what-went-unanswered"
	// DenyWhatPeopleApproved: denied without a person; a person approved it.
	DenyWhatPeopleApproved Kind = "deny-what-people-approved"
	// DenyWhatPeopleDenied: denied without a person; a person denied it.
	DenyWhatPeopleDenied Kind = "deny-what-people-denied"
	// DenyWhatWasAllowed: denied; it was allowed automatically.
	DenyWhatWasAllowed Kind = "deny-what-was-allowed"
	// DenyWhatWentUnanswered: denied; it waited and nobody decided it.
	DenyWhatWentUnanswered Kind = "deny-what-went-unanswered"
	// AskWhatWasAllowed: would need a person; it was allowed automatically.
	AskWhatWasAllowed Kind = "ask-what-was-allowed"
	// AskWhatWasDenied: would need a person; it was denied automatically.
	AskWhatWasDenied Kind = "ask-what-was-denied"
	// OtherRule: the same outcome, through another rule (or remembered
	// choice, or limit), or people of another rule asked.
	OtherRule Kind = "other-rule"
)

// Kinds lists every kind, in the order reports show them.
func Kinds() []Kind {
	return []Kind{
		AllowWhatPeopleDenied, AllowWhatPeopleApproved, AllowWhatWasDenied, AllowWhatWentUnanswered,
		DenyWhatPeopleApproved, DenyWhatPeopleDenied, DenyWhatWasAllowed, DenyWhatWentUnanswered,
		AskWhatWasAllowed, AskWhatWasDenied, OtherRule,
	}
}

// ErrUnknownKind: a name that is no Kind.
var ErrUnknownKind = errors.New("no such kind of change")

// ParseKinds reads a comma-separated list of kinds, as --fail-on takes it.
// An unknown name gives an error wrapping ErrUnknownKind that lists them.
func ParseKinds(s string) ([]Kind, error) {
	var out []Kind
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		k := Kind(name)
		if !slices.Contains(Kinds(), k) {
			return nil, fmt.Errorf("%w: %q (want %s)", ErrUnknownKind, name, kindList())
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func kindList() string {
	var names []string
	for _, k := range Kinds() {
		names = append(names, string(k))
	}
	return strings.Join(names, ", ")
}

// class is a recorded outcome, or a replayed one, as kinds compare them.
type class int

const (
	allowed       class = iota // approved without a person
	denied                     // denied without a person
	peopleOK                   // approved by people
	peopleNo                   // denied by people
	unanswered                 // waited, and nobody decided: expired, approved by timeout, cancelled
	expiredUnseen              // the deadline passed before the broker saw it
	asked                      // replayed: would wait for people
)

// recordedClass is the class of a stored decision d of a request that
// waited for people (a pending event was stored) or not.
func recordedClass(d *decisionMsg, waited bool) class {
	switch {
	case d.outcome == events.Cancelled:
		return unanswered
	case !waited && d.outcome == events.Expired:
		return expiredUnseen
	case !waited && d.outcome == events.Approved:
		return allowed
	case !waited:
		return denied
	case d.outcome == events.Expired, d.outcome == events.Approved && d.auto:
		return unanswered
	case d.outcome == events.Approved:
		return peopleOK
	case d.auto:
		return denied
	}
	return peopleNo
}

// replayedClass is the class of a replayed verdict.
func replayedClass(v *verdict) class {
	switch v.action {
	case policy.Allow:
		return allowed
	case policy.Deny:
		return denied
	case actionExpired:
		return expiredUnseen
	}
	return asked
}

// kindOf is the change from recorded (with its rules) to replayed, and
// false when there is none.
func kindOf(rec class, recRule, recApproval string, rp *verdict) (Kind, bool) {
	got := replayedClass(rp)
	same := rec == got || got == asked && (rec == peopleOK || rec == peopleNo || rec == unanswered)
	if same {
		if recRule == rp.rule && recApproval == rp.approvalRule {
			return "", false
		}
		return OtherRule, true
	}
	switch got {
	case allowed:
		switch rec {
		case peopleNo:
			return AllowWhatPeopleDenied, true
		case peopleOK:
			return AllowWhatPeopleApproved, true
		case denied:
			return AllowWhatWasDenied, true
		case unanswered:
			return AllowWhatWentUnanswered, true
		}
	case denied:
		switch rec {
		case peopleOK:
			return DenyWhatPeopleApproved, true
		case peopleNo:
			return DenyWhatPeopleDenied, true
		case allowed:
			return DenyWhatWasAllowed, true
		case unanswered:
			return DenyWhatWentUnanswered, true
		}
	case asked:
		switch rec {
		case allowed:
			return AskWhatWasAllowed, true
		case denied:
			return AskWhatWasDenied, true
		}
	}
	// An expiry before the broker saw the request is a fact of the time,
	// which the replay keeps: it never meets another class.
	return OtherRule, true
}
