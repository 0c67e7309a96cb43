package creds

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/jwt/v2"

	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Role is what a credential is for.
type Role string

// The roles of DESIGN section 6.
const (
	// RoleAgent asks: it publishes its own requests and cancels, and reads
	// decisions.
	RoleAgent Role = "agent"
	// RoleApprover answers as one principal: the approver runtime of
	// pkg/handler, or `approver-bot cli`.
	RoleApprover Role = "approver"
	// RoleBot is an approver bot: it answers as each principal its channels
	// map, and keeps its channels' buckets and webhook log.
	RoleBot Role = "bot"
	// RoleBroker runs the broker: it alone publishes decisions.
	RoleBroker Role = "broker"
	// RoleGateway is the MCP gateway (cmd/mcp-gateway): it asks as one
	// agent, and with a principal its elicitation also reads that agent's
	// pending requests and answers them as that principal.
	RoleGateway Role = "gateway"
	// RoleAuditor reads the whole record and publishes nothing of the
	// contract: `broker audit verify` and `broker audit witness`.
	RoleAuditor Role = "auditor"
)

// Roles lists the roles, for messages.
var Roles = []Role{RoleAgent, RoleApprover, RoleBot, RoleBroker, RoleGateway, RoleAuditor}

// Identity is who a credential is issued to.
type Identity struct {
	Role Role
	// Name is the agent (RoleAgent), the principal (RoleApprover), or a
	// name for the bot, broker or gateway (it names the user in the
	// server's logs).
	Name string
	// Principals are the principals a bot answers as (RoleBot).
	Principals []string
	// Agent is the agent a gateway asks as (RoleGateway): its
	// identity.agent.
	Agent string
	// Principal, if set, is the principal a gateway's elicitation answers
	// as (RoleGateway): its elicitation.principal.
	Principal string
	// Expires, if set, is when the credential stops working (Unix seconds).
	Expires int64
	// Private (RoleAgent, RoleGateway) keeps the agent from reading any other agent's
	// decisions: it reads its own through assent-private.<agent>.> and its
	// own inbox (_INBOX_<agent>), not the stream (handler.Config.Private).
	Private bool
}

// Permissions are the subjects who may publish on and subscribe to: exactly
// what its role needs of the wire contract and of JetStream's API, and
// nothing of another agent's, principal's or the broker's.
func (who Identity) Permissions() (jwt.Permissions, error) {
	if err := events.CheckToken(string(who.Role)+" name", who.Name); err != nil && who.Role != RoleBroker && who.Role != RoleBot && who.Role != RoleGateway && who.Role != RoleAuditor {
		return jwt.Permissions{}, err
	}
	return who.permissions()
}

// permissions are who's permissions, its name taken as it is: a scope's
// template names the user "{{name()}}" (signers.go).
func (who Identity) permissions() (jwt.Permissions, error) {
	var p perms
	switch who.Role {
	case RoleBroker:
		// The broker owns the stream, its buckets and its consumers. It
		// publishes no copy of a decision: the server republishes what the
		// stream stored, on its own, and a publish there by anyone would
		// look to readers like a stored decision.
		p.pub(">")
		p.sub(">")
		p.denyPub(events.DecidedPrefix + ">")
		return p.jwt(), nil
	case RoleAgent:
		if who.Private {
			p.privateAgent(who.Name)
			break
		}
		p.agent(who.Name)
	case RoleApprover:
		p.approver(who.Name)
	case RoleAuditor:
		p.client()
		p.readConsumers(handler.StreamName)
	case RoleBot:
		if len(who.Principals) == 0 {
			return jwt.Permissions{}, errors.New("a bot answers as the principals its channels map: name at least one")
		}
		for _, pr := range who.Principals {
			if err := events.CheckToken("principal", pr); err != nil {
				return jwt.Permissions{}, err
			}
			p.approver(pr)
		}
		for _, b := range []string{handler.ChannelBucket, email.LinkBucket, webhook.SeenBucket} {
			p.bucket(b, true)
		}
		p.stream(webhook.LogStream, true)
		p.pub(webhook.LogSubjectPrefix + ">")
		// Its webhooks serve every agent: they ask the broker whether a
		// request exists and whose it is (never its args).
		p.pub(events.BrokerLookupPrefix + "*")
	case RoleGateway:
		if err := events.CheckToken("agent", who.Agent); err != nil {
			return jwt.Permissions{}, fmt.Errorf("a gateway asks as one agent, its identity.agent: %w", err)
		}
		if who.Private {
			p.privateAgent(who.Agent)
		} else {
			p.agent(who.Agent)
		}
		if who.Principal != "" {
			if err := events.CheckToken("principal", who.Principal); err != nil {
				return jwt.Permissions{}, err
			}
			p.elicit(who.Agent, who.Principal)
		}
	default:
		return jwt.Permissions{}, fmt.Errorf("role %q: want one of %v", who.Role, Roles)
	}
	return p.jwt(), nil
}

// perms collects allowed subjects, and subjects denied publishing although
// an allowed one covers them.
type perms struct{ pubs, subs, denyPubs []string }

func (p *perms) pub(s ...string) {
	for _, x := range s {
		if !slices.Contains(p.pubs, x) {
			p.pubs = append(p.pubs, x)
		}
	}
}

func (p *perms) sub(s ...string) {
	for _, x := range s {
		if !slices.Contains(p.subs, x) {
			p.subs = append(p.subs, x)
		}
	}
}

func (p *perms) denyPub(s string) { p.denyPubs = append(p.denyPubs, s) }

func (p *perms) jwt() jwt.Permissions {
	var out jwt.Permissions
	out.Pub.Allow.Add(p.pubs...)
	out.Pub.Deny.Add(p.denyPubs...)
	out.Sub.Allow.Add(p.subs...)
	return out
}

// client is what every client of the contract needs: replies to its
// requests (JetStream API answers and publish acknowledgements come to its
// inbox), the stream's info and reads (direct gets of stored decisions),
// the server's copies of stored decisions (assent-decided.*) and
// rejections as they happen.
//
// Credentials of this minor version still read what SDKs before it read:
// the stored decision subjects themselves (assent.decision.*), whose plain
// subscribers also see decisions the stream refused, and the request state
// bucket, which brokers no longer write (its reads find nothing, at once).
// Both go in the next minor version.
func (p *perms) client() {
	p.sub("_INBOX.>", events.DecidedPrefix+"*", events.RejectionPrefix+"*")
	p.pub("$JS.API.INFO")
	p.stream(handler.StreamName, false)
	p.sub(events.DecisionPrefix + "*")  // old SDKs; goes in the next minor version
	p.bucket(events.StateBucket, false) // old SDKs; goes in the next minor version
}

// agent may publish its own requests and cancels only, and ask the broker
// about its own requests (ownRequests).
func (p *perms) agent(name string) {
	p.client()
	p.pub(events.RequestPrefix+name, events.CancelPrefix+name+".>")
	p.ownRequests(name)
}

// ownRequests may ask the broker about agent name's requests only: what it
// stored of one (assent-private.<name>.lookup.<id>: the SDK learns its
// deadline there), the pending ones, and to cancel them
// (events.AgentSubject). Not assent-broker.lookup.<id>, which answers for
// any agent's request: an agent has no need to ask about another's.
func (p *perms) ownRequests(name string) {
	p.pub(events.PrivatePrefix + name + ".lookup.>")
	for _, kind := range []string{events.AgentList, events.AgentCancel} {
		p.pub(events.PrivatePrefix + name + "." + kind)
	}
}

// privateAgent may publish its own requests and cancels, and read only what
// is its own: its decisions and rejections, copied to its private subjects,
// and the broker's answers to its lookups, in its own inbox.
func (p *perms) privateAgent(name string) {
	p.pub(events.RequestPrefix+name, events.CancelPrefix+name+".>")
	p.ownRequests(name)
	p.sub(handler.PrivateInbox(name)+".>", events.PrivatePrefix+name+".>")
}

// elicit is what the MCP gateway's elicitation needs besides its agent's
// permissions: the pending events of agent's requests, as they happen (a
// plain subscription, no consumer), and answering them as principal (a
// JetStream publish, acknowledged to the inbox). Not the stream's consumers,
// nor presence: the gateway uses neither.
func (p *perms) elicit(agent, principal string) {
	p.sub(events.PendingPrefix + agent)
	p.pub(events.ResponsePrefix + principal + ".>")
}

// approver may answer as principal only, read the stream through consumers
// (making, reading and acknowledging them; not deleting any), and announce
// its own presence only.
func (p *perms) approver(principal string) {
	p.client()
	p.pub(events.ResponsePrefix + principal + ".>")
	p.readConsumers(handler.StreamName)
	p.pub("$JS.API.STREAM.INFO.KV_"+events.PresenceBucket, "$KV."+events.PresenceBucket+"."+principal+".>")
}

// readConsumers may read stream name through consumers: make, read and
// acknowledge them, never delete one.
func (p *perms) readConsumers(name string) {
	p.pub("$JS.API.CONSUMER.CREATE."+name, "$JS.API.CONSUMER.CREATE."+name+".>", "$JS.API.CONSUMER.DURABLE.CREATE."+name+".>",
		"$JS.API.CONSUMER.INFO."+name+".>", "$JS.API.CONSUMER.MSG.NEXT."+name+".>", "$JS.ACK."+name+".>", "$JS.FC."+name+".>")
}

// stream grants reading stream name (info, single messages), and with admin
// managing it (create, update, info, delete, purge) and its consumers: for
// the buckets and streams a bot owns.
// Subjects are kept few and short: a user JWT travels in the CONNECT line,
// which servers bound (max_control_line).
func (p *perms) stream(name string, admin bool) {
	p.pub("$JS.API.STREAM.MSG.GET."+name, "$JS.API.DIRECT.GET."+name, "$JS.API.DIRECT.GET."+name+".>")
	if !admin {
		p.pub("$JS.API.STREAM.INFO." + name)
		return
	}
	p.pub("$JS.API.STREAM.*." + name)
	p.consumers(name)
}

// consumers grants managing the consumers of stream name, durable and
// ordered: CREATE, INFO, DELETE (one token before the stream), MSG.NEXT and
// DURABLE.CREATE (two), flow control and acks.
func (p *perms) consumers(name string) {
	p.pub("$JS.API.CONSUMER.*."+name, "$JS.API.CONSUMER.*."+name+".>", "$JS.API.CONSUMER.*.*."+name+".>",
		"$JS.ACK."+name+".>", "$JS.FC."+name+".>")
}

// bucket grants reading key-value bucket name, and with write putting,
// deleting and making it.
func (p *perms) bucket(name string, write bool) {
	p.stream("KV_"+name, write)
	if write {
		p.pub("$KV." + name + ".>")
	}
}
