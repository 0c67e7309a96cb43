package app

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/creds"
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
				creds.RoleBot: "an approver bot", creds.RoleBroker: "a broker replica", creds.RoleGateway: "an MCP gateway"}[role],
			required: required,
			about:    about,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR` (broker creds init)")
				out := fs.String("out", "", "write the credentials to `FILE` (mode 0600) instead of standard output")
				expires := fs.Duration("expires", 0, "the credentials stop working after this `duration` (default: never)")
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
					if *expires > 0 {
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
					_, err = fmt.Fprintf(c.Stderr, "%s credentials for %s written to %s\n", role, args[0], *out)
					return err
				}
			},
		}
	}
	return []*command{
		{
			name: "creds init", synopsis: "--dir DIR",
			summary:  "make the NATS credentials authority",
			required: []string{"dir"},
			about: `Makes an operator, a system account and the ASSENT account, with their nkey
seeds (mode 0600) and JWTs in DIR; does nothing if DIR holds them already.
Keep DIR private: whoever reads it can issue any credential. Then run the
embedded server in operator mode (broker --nats-operator DIR), or a
nats-server with the configuration "broker creds server-config" prints.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the `DIR` to keep the keys in (made if missing)")
				return func(_ context.Context, c CLI, _ []string) error {
					a, made, err := creds.Init(*dir)
					if err != nil {
						return err
					}
					verb := "made"
					if !made {
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
		{
			name: "creds server-config", synopsis: "--dir DIR [--listen ADDR] [--store DIR] [--name NAME]",
			summary:  "print a nats-server configuration in operator mode",
			required: []string{"dir"},
			about: `Prints a nats-server configuration that trusts the authority in DIR
(operator mode, the accounts preloaded) with JetStream on: clients then need
credentials from "broker creds", bound by their roles' permissions. Add TLS
and cluster blocks as docs/security.md shows.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				dir := fs.String("dir", "", "the credentials authority's `DIR`")
				listen := fs.String("listen", "127.0.0.1:4222", "where clients connect: `host:port`")
				store := fs.String("store", "/var/lib/nats", "JetStream's storage `DIR`")
				name := fs.String("name", "assent-1", "the server's `name`")
				return func(_ context.Context, c CLI, _ []string) error {
					a, err := creds.Open(*dir)
					if err != nil {
						return err
					}
					_, err = fmt.Fprint(c.Stdout, a.ServerConfig(creds.ServerOptions{Listen: *listen, StoreDir: *store, Name: *name}))
					return err
				}
			},
		},
	}
}
