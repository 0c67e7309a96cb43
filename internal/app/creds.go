package app

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/textsafe"
)

// credsCommands are `broker creds ...`: the credentials authority and the
// credentials it issues (docs/security.md).
func credsCommands() []*command {
	issue := func(role creds.Role, arg, about string) *command {
		synopsis := arg + " --dir DIR [--out FILE] [--expires DURATION]"
		if role == creds.RoleAgent {
			synopsis = arg + " --dir DIR [--private] [--out FILE] [--expires DURATION]"
		}
		if role == creds.RoleBot {
			synopsis = arg + " --principals P,Q --dir DIR [--out FILE] [--expires DURATION]"
		}
		required := []string{"dir"}
		if role == creds.RoleGateway {
			synopsis = arg + " --agent AGENT [--principal PRINCIPAL] --dir DIR [--private] [--out FILE] [--expires DURATION]"
			required = []string{"agent", "dir"}
		}
		return &command{
			name: "creds " + string(role), synopsis: synopsis, args: []string{arg},
			summary: "issue NATS credentials for " + map[creds.Role]string{creds.RoleAgent: "an agent", creds.RoleApprover: "an approver",
				creds.RoleBot: "an approver bot", creds.RoleBroker: "a broker replica", creds.RoleGateway: "an MCP gateway", creds.RoleAuditor: "an auditor"}[role],
			required: required,
			about:    about,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR` (broker creds init)")
				out := fs.String("out", "", "write the credentials to `FILE` (mode 0600) instead of standard output")
				expires := fs.Duration("expires", creds.DefaultExpiry, "the credentials stop working after this `duration`; 0 for never")
				var principals *string
				if role == creds.RoleBot {
					principals = fs.String("principals", "", "the `principals` the bot's channels answer as, comma-separated")
				}
				private := new(bool)
				if role == creds.RoleAgent || role == creds.RoleGateway {
					private = fs.Bool("private", false, "the agent reads its own decisions only, through the broker (the SDK's Config.Private; docs/security.md)")
				}
				agent, principal := new(string), new(string)
				if role == creds.RoleGateway {
					agent = fs.String("agent", "", "the `AGENT` the gateway asks as (its identity.agent)")
					principal = fs.String("principal", "", "the `PRINCIPAL` the gateway's elicitation answers as (its elicitation.principal); none if unset")
				}
				return func(_ context.Context, c CLI, args []string) error {
					a, err := creds.Open(*dir)
					if err != nil {
						return err
					}
					who := creds.Identity{Role: role, Name: args[0], Private: *private, Agent: *agent, Principal: *principal}
					if principals != nil && *principals != "" {
						who.Principals = strings.Split(*principals, ",")
					}
					switch {
					case *expires < 0:
						return fmt.Errorf("--expires %s: want a positive duration, or 0 for never", *expires)
					case *expires > 0:
						who.Expires = time.Now().Add(*expires).Unix()
					}
					data, err := a.Issue(who)
					if err != nil {
						return err
					}
					if *out == "" {
						_, err = c.Stdout.Write(data)
						return err
					}
					if err := os.WriteFile(*out, data, 0o600); err != nil {
						return err
					}
					until := "never expire"
					if who.Expires > 0 {
						until = "expire " + time.Unix(who.Expires, 0).UTC().Format(time.RFC3339)
					}
					_, err = fmt.Fprintf(c.Stderr, "%s credentials for %s written to %s; they %s\n", role, args[0], *out, until)
					return err
				}
			},
		}
	}
	return []*command{
		{
			name: "creds init", synopsis: "--dir DIR [--max-connections N] [--max-consumers N] [--max-streams N] [--max-storage SIZE]",
			summary:  "make the NATS credentials authority",
			required: []string{"dir"},
			about: `Makes an operator, a system account and the ASSENT account, with their nkey
seeds (mode 0600) and JWTs in DIR, and the account's signing keys (DIR/signers,
one per kind of user: the agent, approver and broker ones scoped, so that the
account fixes what their users may do); does nothing if DIR holds them
already, and gives an authority made before signing keys its own. Keep DIR
private: whoever reads it can issue credentials. Issuing needs only
DIR/signers; keep operator.nk and assent.nk offline (operator.nk is needed to
revoke). The limits bound the account as a whole (0 for none); each
connection's own are per role (docs/security.md). Then run the embedded
server in operator mode (broker --nats-operator DIR), or a nats-server with
the configuration "broker creds server-config" prints.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the `DIR` to keep the keys in (made if missing)")
				l := creds.DefaultAccountLimits
				fs.Int64Var(&l.Connections, "max-connections", l.Connections, "the most clients connected at once, in all roles")
				fs.Int64Var(&l.Consumers, "max-consumers", l.Consumers, "the most JetStream consumers (the brokers', one per approver runtime and bot)")
				fs.Int64Var(&l.Streams, "max-streams", l.Streams, "the most streams and buckets")
				storage := fs.String("max-storage", "0", "the most bytes stored on disk, as in 50G; 0 for the disk's size")
				return func(_ context.Context, c CLI, _ []string) error {
					var err error
					if l.Storage, err = creds.ParseSize(*storage); err != nil {
						return fmt.Errorf("--max-storage: %w", err)
					}
					a, made, err := creds.InitLimits(*dir, l)
					if err != nil {
						return err
					}
					verb := "made"
					switch {
					case a.Upgraded():
						verb = "given signing keys (push the account to running servers: broker creds push)"
					case !made:
						verb = "already there"
					}
					_, err = fmt.Fprintf(c.Stdout, "credentials authority %s in %s\naccount ASSENT %s\nsystem account %s\n", verb, *dir, a.Account, a.SystemAccount)
					return err
				}
			},
		},
		issue(creds.RoleAgent, "AGENT", `Issues credentials for AGENT: it may publish its own requests
(assent.request.AGENT) and cancels (assent.cancel.AGENT.>), and read
decisions; nothing else. With --private it reads only its own decisions,
through the broker. docs/security.md lists every subject.`),
		issue(creds.RoleApprover, "PRINCIPAL", `Issues credentials for an approver answering as PRINCIPAL: it may publish
answers on assent.response.PRINCIPAL.> only, read pending requests through its
own consumers, and announce its presence.`),
		issue(creds.RoleBot, "NAME", `Issues credentials for an approver bot called NAME: it answers as each of
--principals (the principals its channels map) and keeps its channels'
buckets and webhook delivery log.`),
		issue(creds.RoleGateway, "NAME", `Issues credentials for an MCP gateway called NAME (cmd/mcp-gateway): it asks
as AGENT, with an agent's permissions (the gateway's identity.agent must name
it), and with --principal it also reads AGENT's pending requests and answers
them as PRINCIPAL, for asking the user in the client (its
elicitation.principal); nothing of another agent's or principal's.`),
		issue(creds.RoleBroker, "NAME", `Issues credentials for a broker replica called NAME: the only role that may
publish decisions (assent.decision.>) and manage the stream and buckets.`),
		issue(creds.RoleAuditor, "NAME", `Issues credentials for an auditor called NAME: it reads the whole stream
(single messages and its own consumers) and publishes nothing of the
contract; what "broker audit verify" and "broker audit witness" need.`),
		{
			name: "creds server-config", synopsis: "--dir DIR [--listen ADDR] [--store DIR] [--name NAME] [--resolver full|memory] [--nats-tls-cert FILE --nats-tls-key FILE [--nats-tls-client-ca FILE]] [--cluster NAME --cluster-listen ADDR --routes HOST:PORT,... --route-cert FILE --route-key FILE --route-ca FILE]",
			summary:  "print a nats-server configuration in operator mode",
			required: []string{"dir"},
			about: `Prints a nats-server configuration that trusts the authority in DIR
(operator mode, the accounts preloaded into a full resolver, which keeps the
updates "broker creds revoke" pushes) with JetStream on: clients then need
credentials from "broker creds", bound by their roles' permissions. With
--nats-tls-cert and --nats-tls-key clients connect over TLS (tls:// URLs),
with --nats-tls-client-ca also showing a certificate that CA signed (as the
broker's embedded server takes them). With --cluster the
server is one node of a cluster: its routes are TLS with certificates both
ways (--route-cert, --route-key, --route-ca) and authenticated by a secret
kept in DIR, the same in every node's configuration (docs/cluster.md).`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR`")
				var o creds.ServerOptions
				fs.StringVar(&o.Listen, "listen", "127.0.0.1:4222", "where clients connect: `host:port`")
				fs.StringVar(&o.StoreDir, "store", "/var/lib/nats", "JetStream's storage `DIR` (the resolver keeps account JWTs in DIR/jwt)")
				fs.StringVar(&o.Name, "name", "assent-1", "the server's `name`, unique in a cluster")
				fs.StringVar(&o.CertFile, "nats-tls-cert", "", "the server's TLS certificate `file`, for clients")
				fs.StringVar(&o.KeyFile, "nats-tls-key", "", "the key `file` of --nats-tls-cert")
				fs.StringVar(&o.ClientCAFile, "nats-tls-client-ca", "", "require client certificates this CA `file` signed (mutual TLS)")
				resolver := fs.String("resolver", "full", "where the server keeps the accounts: full (in --store, kept across restarts) or memory (from this configuration alone)")
				var c creds.ClusterOptions
				fs.StringVar(&c.Name, "cluster", "", "make the server a node of the cluster `NAME`")
				fs.StringVar(&c.Listen, "cluster-listen", "0.0.0.0:6222", "where the other nodes' routes connect: `host:port`")
				routes := fs.String("routes", "", "the nodes' route addresses, `host:port,...` (this node's may be among them)")
				fs.StringVar(&c.CertFile, "route-cert", "", "this node's route certificate `file`, for server and client authentication")
				fs.StringVar(&c.KeyFile, "route-key", "", "the key `file` of --route-cert")
				fs.StringVar(&c.CAFile, "route-ca", "", "the CA `file` that signed every node's route certificate")
				return func(_ context.Context, cl CLI, _ []string) error {
					a, err := creds.Open(*dir)
					if err != nil {
						return err
					}
					switch *resolver {
					case "full":
					case "memory":
						o.MemoryResolver = true
					default:
						return fmt.Errorf("--resolver %q: want full or memory", *resolver)
					}
					if c.Name != "" {
						if *routes != "" {
							c.Routes = strings.Split(*routes, ",")
						}
						o.Cluster = &c
					}
					conf, err := a.ServerConfig(o)
					if err != nil {
						return err
					}
					_, err = fmt.Fprint(cl.Stdout, conf)
					return err
				}
			},
		},
		{
			name: "creds revoke", synopsis: "WHO --dir DIR [--push=false] [--nats-url URL] [--nats-creds FILE]", args: []string{"WHO"},
			summary:  "revoke credentials, and tell the running servers",
			required: []string{"dir"},
			about: `Revokes credentials before they expire, with no restart: WHO is a user's public
key (U..., as servers log it), a credentials file, or ROLE:NAME for every
user the authority issued to that name (as in agent:coder; "broker creds list"
shows them). The account's JWT in DIR lists the revocation (this needs the
operator's seed, operator.nk), and is then pushed to the server at --nats-url
as a system account user (made with DIR's sys.nk, or --nats-creds): the
server closes the revoked users' connections and refuses new ones, and in a
cluster tells the other nodes. A server started later loads the revocation
from DIR (the embedded server) or keeps it in its resolver (server-config).`,
			define: accountChange(func(c CLI, a *creds.Authority, who string) error {
				users, err := usersOf(a, who)
				if err != nil {
					return err
				}
				if err := a.Revoke(users...); err != nil {
					return err
				}
				for _, u := range users {
					fmt.Fprintf(c.Stdout, "revoked %s\n", u)
				}
				_, err = fmt.Fprintf(c.Stdout, "the account's JWT in %s lists the revocation\n", a.Dir)
				return err
			}),
		},
		{
			name: "creds rotate", synopsis: "KIND --dir DIR [--push=false] [--nats-url URL] [--nats-creds FILE]", args: []string{"KIND"},
			summary:  "replace a signing key, cutting off every user it signed",
			required: []string{"dir"},
			about: `Replaces the account's signing key of KIND (broker, agent, agent-private,
approver, bot, gateway or auditor) with a new one, as when it leaked, and pushes the
account to the server at --nats-url: every user the old key signed is
refused from then on and its connections closed. Issue that kind's
credentials again afterwards. Needs the operator's seed, operator.nk.`,
			define: accountChange(func(c CLI, a *creds.Authority, kind string) error {
				if err := a.RotateSigner(kind); err != nil {
					return err
				}
				_, err := fmt.Fprintf(c.Stdout, "the %s signing key in %s is new; issue %s credentials again\n", kind, a.Dir, kind)
				return err
			}),
		},
		{
			name: "creds push", synopsis: "--dir DIR [--nats-url URL] [--nats-creds FILE]",
			summary:  "send the account's JWT to the running servers",
			required: []string{"dir"},
			about: `Sends the account's JWT in DIR (its signing keys, limits and revocations) to
the server at --nats-url, as a system account user (made with DIR's sys.nk,
or --nats-creds), which applies it at once and, in a cluster, tells the other
nodes. "broker creds revoke" does this itself.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR`")
				s := natsFlags(fs, "a system account user's credentials `file`; default: one made with DIR's sys.nk")
				return func(ctx context.Context, c CLI, _ []string) error {
					a, err := creds.Open(*dir)
					if err != nil {
						return err
					}
					return pushAccount(ctx, c, a, *s)
				}
			},
		},
		{
			name: "creds list", synopsis: "--dir DIR",
			summary:  "list the credentials issued, and which still work",
			required: []string{"dir"},
			about: `Lists the users the authority in DIR issued credentials to, oldest first: when,
role, name, public key, and whether they are valid, expired or revoked.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR`")
				return func(_ context.Context, c CLI, _ []string) error {
					a, err := creds.Open(*dir)
					if err != nil {
						return err
					}
					issued, err := a.IssuedUsers()
					if err != nil {
						return err
					}
					if len(issued) == 0 {
						_, err := fmt.Fprintf(c.Stdout, "no credentials issued from %s yet (broker creds agent|approver|bot|gateway|broker)\n", *dir)
						return err
					}
					w := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "ISSUED\tROLE\tNAME\tUSER\tSTATE")
					now := time.Now()
					for _, u := range issued {
						state := "valid, never expires"
						if u.Expires > 0 {
							state = "valid until " + time.Unix(u.Expires, 0).UTC().Format(time.RFC3339)
						}
						if at, ok := a.Revoked(u.User); ok {
							state = "revoked " + at.UTC().Format(time.RFC3339)
						} else if u.Expires > 0 && now.Unix() >= u.Expires {
							state = "expired " + time.Unix(u.Expires, 0).UTC().Format(time.RFC3339)
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", u.At.Format(time.RFC3339), u.Role, textsafe.Text(u.Name), u.User, state)
					}
					return w.Flush()
				}
			},
		},
	}
}

// accountChange defines a command that changes the account of the
// authority in --dir with change (given the command's argument), then
// pushes it to the server at --nats-url unless --push=false.
func accountChange(change func(c CLI, a *creds.Authority, arg string) error) func(*flag.FlagSet) func(context.Context, CLI, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
		dir := fs.String("dir", "", "the credentials authority's `DIR`")
		push := fs.Bool("push", true, "push the account to the server at --nats-url")
		s := natsFlags(fs, "a system account user's credentials `file`; default: one made with DIR's sys.nk")
		return func(ctx context.Context, c CLI, args []string) error {
			a, err := creds.Open(*dir)
			if err != nil {
				return err
			}
			if err := change(c, a, args[0]); err != nil {
				return err
			}
			if !*push {
				return nil
			}
			return pushAccount(ctx, c, a, *s)
		}
	}
}

// usersOf finds the users who names: a public key, a credentials file, or
// ROLE:NAME (every user a's register has for it).
func usersOf(a *creds.Authority, who string) ([]string, error) {
	if nkeys.IsValidPublicUserKey(who) {
		return []string{who}, nil
	}
	if role, name, ok := strings.Cut(who, ":"); ok && !strings.ContainsAny(who, "/\\") {
		issued, err := a.IssuedUsers()
		if err != nil {
			return nil, err
		}
		var users []string
		for _, u := range issued {
			if string(u.Role) == role && u.Name == name {
				users = append(users, u.User)
			}
		}
		if len(users) == 0 {
			return nil, fmt.Errorf("the authority in %s issued nothing to %s (broker creds list shows what it did); give the user's public key (U...) or its credentials file instead", a.Dir, who)
		}
		return users, nil
	}
	data, err := os.ReadFile(who)
	if err != nil {
		return nil, fmt.Errorf("%q is not a user's public key (U...), ROLE:NAME, or a credentials file: %w", who, err)
	}
	u, err := creds.UserOf(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	return []string{u}, nil
}

// pushAccount sends a's account JWT to the server s reaches, as a system
// user made with a's sys.nk unless s has credentials.
func pushAccount(ctx context.Context, c CLI, a *creds.Authority, s natsconn.Settings) error {
	var extra []nats.Option
	if s.Creds == "" {
		token, seed, err := a.SystemUser(time.Minute)
		if err != nil {
			return err
		}
		extra = append(extra, nats.UserJWTAndSeed(token, seed))
	}
	nc, err := natsconn.Connect(s, append(extra, nats.Name("assent-creds"))...)
	if err != nil {
		return fmt.Errorf("%w; the account in %s is changed, and a server takes it at its next start or \"broker creds push\"", err, a.Dir)
	}
	defer nc.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	said, err := a.Push(pctx, nc)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.Stdout, "pushed the account to %s: %s\n", s.URL, said)
	return err
}
