package creds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
)

// Users are not signed by the ASSENT account's own key but by its signing
// keys, one per kind of user, so that the account's identity key can stay
// offline: issuing needs only a signing key, and a leaked one is replaced
// by changing the account's JWT, without a new account.
//
// Most signing keys are scoped: the account's JWT fixes the permissions
// and limits of every user they sign, as a template naming the user
// ({{name()}}), so that a leaked agent signing key issues agents, never a
// broker. A bot answers as several principals and a gateway as an agent and
// a principal; a template can say only one name with its case intact (NATS
// lower-cases tags), so their signing keys are not scoped and their users
// carry their own permissions and limits.

// signerDir holds the signing keys' seeds, signerDir/<kind>.nk.
const signerDir = "signers"

// A signer kind is a signing key of the account and the users it signs.
const (
	signBroker       = "broker"
	signAgent        = "agent"
	signPrivateAgent = "agent-private"
	signApprover     = "approver"
	signBot          = "bot"
	signGateway      = "gateway"
	signAuditor      = "auditor"
)

// signerKinds lists the kinds, in the order the account's JWT names them.
var signerKinds = []string{signBroker, signAgent, signPrivateAgent, signApprover, signBot, signGateway, signAuditor}

// signerOf is the kind of signing key that signs who.
func signerOf(who Identity) string {
	switch who.Role {
	case RoleAgent:
		if who.Private {
			return signPrivateAgent
		}
		return signAgent
	case RoleApprover:
		return signApprover
	case RoleBot:
		return signBot
	case RoleGateway:
		return signGateway
	case RoleAuditor:
		return signAuditor
	}
	return signBroker
}

// scoped reports whether the account's JWT fixes what the users of kind
// may do.
func scoped(kind string) bool { return kind != signBot && kind != signGateway }

// template is what the users of a scoped kind may do: their role's
// permissions with the user's name for the agent's or principal's, and the
// role's limits.
func template(kind string) (jwt.UserPermissionLimits, error) {
	who := Identity{Name: "{{name()}}"}
	switch kind {
	case signBroker:
		who.Role = RoleBroker
	case signAgent:
		who.Role = RoleAgent
	case signPrivateAgent:
		who.Role, who.Private = RoleAgent, true
	case signApprover:
		who.Role = RoleApprover
	case signAuditor:
		who.Role = RoleAuditor
	default:
		return jwt.UserPermissionLimits{}, fmt.Errorf("signing key %q is not scoped", kind)
	}
	perms, err := who.permissions()
	if err != nil {
		return jwt.UserPermissionLimits{}, err
	}
	lim := jwt.UserPermissionLimits{Permissions: perms}
	lim.Limits = jwt.Limits{NatsLimits: roleLimits(who.Role)}
	return lim, nil
}

// Limits of one user (one connection) of each role. The payload bound is
// twice the broker's default event limit (1 MiB): room for an event and
// its headers, never the server's whole 8 MiB.
const (
	clientMaxPayload = 2 << 20
	clientMaxSubs    = 10000
)

// roleLimits bound what one connection of role may hold on the server:
// subscriptions (the SDK holds two for each request it waits on, an
// approver one for each it handles) and the size of one message. The
// broker is not bound.
func roleLimits(r Role) jwt.NatsLimits {
	if r == RoleBroker {
		return jwt.NatsLimits{Subs: jwt.NoLimit, Data: jwt.NoLimit, Payload: jwt.NoLimit}
	}
	return jwt.NatsLimits{Subs: clientMaxSubs, Data: jwt.NoLimit, Payload: clientMaxPayload}
}

// AccountLimits bound the ASSENT account as a whole, so that no client,
// whatever its role, exhausts the server: its connections, its JetStream
// consumers and streams, and its stored bytes.
type AccountLimits struct {
	// Connections is how many clients may be connected at once.
	Connections int64
	// Consumers is how many JetStream consumers the account may have (the
	// brokers' few, one for each approver runtime and bot).
	Consumers int64
	// Streams is how many streams and buckets the account may have.
	Streams int64
	// Storage is how many bytes the account's streams may store on disk;
	// 0 for no bound but the disk's.
	Storage int64
}

// DefaultAccountLimits are the limits `broker creds init` sets.
var DefaultAccountLimits = AccountLimits{Connections: 10000, Consumers: 2000, Streams: 64}

// apply sets l on the account's claims.
func (l AccountLimits) apply(ac *jwt.AccountClaims) {
	ac.Limits.Conn = l.Connections
	ac.Limits.LeafNodeConn = 0
	disk := l.Storage
	if disk == 0 {
		disk = jwt.NoLimit
	}
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: disk, Streams: l.Streams, Consumer: l.Consumers}
}

// ParseSize reads a size in bytes, with an optional binary suffix (K, M,
// G, T: 1024 times the one before; "KiB" and "B" spellings too).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	for i, u := range "KMGT" {
		if strings.HasSuffix(t, string(u)) {
			t = strings.TrimSuffix(t, string(u))
			mult = int64(1) << (10 * (i + 1))
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || n < 0 || (n > 0 && mult > 1 && n > (1<<62)/mult) {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with K, M, G or T (as in 50G)", s)
	}
	return n * mult, nil
}

// DefaultExpiry is how long `broker creds` makes credentials last unless
// told otherwise: a leaked one stops working on its own.
const DefaultExpiry = 90 * 24 * time.Hour

// RotateSigner replaces the signing key of kind (broker, agent,
// agent-private, approver, bot or gateway) with a new one: once the servers
// have the account (Push), every user the old key signed is refused and
// its connections closed, and users are issued again with the new key. It
// needs the operator's seed.
func (a *Authority) RotateSigner(kind string) error {
	if !slices.Contains(signerKinds, kind) {
		return fmt.Errorf("signing key %q: want one of %s", kind, strings.Join(signerKinds, ", "))
	}
	if a.operator == nil {
		return fmt.Errorf("credentials authority: changing the account needs the operator's seed, %s, in %s: run this where it is kept", operatorSeed, a.Dir)
	}
	ac, err := a.accountClaims()
	if err != nil {
		return err
	}
	path := filepath.Join(a.Dir, signerDir, kind+".nk")
	if old, ok := a.signers[kind]; ok {
		pub, _ := old.PublicKey()
		delete(ac.SigningKeys, pub)
		delete(a.signers, kind)
	}
	if err := os.Rename(path, path+".old"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("credentials authority: %w", err)
	}
	restore := func(err error) error {
		os.Remove(path)
		if rerr := os.Rename(path+".old", path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return fmt.Errorf("%w; and putting the old key back: %v", err, rerr)
		}
		return err
	}
	if err := a.addSigners(ac); err != nil {
		return restore(err)
	}
	if err := a.setAccount(ac); err != nil {
		return restore(err)
	}
	if err := os.Remove(path + ".old"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("credentials authority: %w", err)
	}
	return nil
}
