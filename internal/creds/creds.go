// Package creds issues the NATS credentials of an Assent deployment: an
// operator, its system account and the account every Assent client lives in,
// and user JWTs for agents, approvers, approver bots and brokers that carry
// exactly the wire contract's permissions (DESIGN section 6). With them the
// NATS server itself refuses a forged request, answer, cancel or decision.
//
// The keys live in one directory, each seed in a file only its owner reads:
//
//	operator.nk  operator.jwt   the operator (trusted by the servers)
//	sys.nk       sys.jwt        the system account
//	assent.nk    assent.jwt     the account of agents, approvers, bots, brokers
package creds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/natsembed"
)

// Authority holds the keys that sign every credential of a deployment.
type Authority struct {
	Dir                 string
	operator, sys, acct nkeys.KeyPair
	// OperatorJWT, SystemJWT and AccountJWT are the operator's and the two
	// accounts' JWTs, which servers load.
	OperatorJWT, SystemJWT, AccountJWT string
	// SystemAccount and Account are the accounts' public keys.
	SystemAccount, Account string
}

// Files of an authority's directory.
const (
	operatorSeed = "operator.nk"
	operatorJWT  = "operator.jwt"
	sysSeed      = "sys.nk"
	sysJWT       = "sys.jwt"
	acctSeed     = "assent.nk"
	acctJWT      = "assent.jwt"
)

// Init opens the authority in dir, making its keys first if dir holds none.
// made reports whether it did.
func Init(dir string) (a *Authority, made bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, operatorSeed)); errors.Is(err, fs.ErrNotExist) {
		a, err := create(dir)
		return a, err == nil, err
	}
	a, err = Open(dir)
	return a, false, err
}

// Open reads the authority in dir, made by Init.
func Open(dir string) (*Authority, error) {
	a := &Authority{Dir: dir}
	var err error
	if a.operator, err = readSeed(dir, operatorSeed); err != nil {
		return nil, err
	}
	if a.sys, err = readSeed(dir, sysSeed); err != nil {
		return nil, err
	}
	if a.acct, err = readSeed(dir, acctSeed); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{operatorJWT, &a.OperatorJWT}, {sysJWT, &a.SystemJWT}, {acctJWT, &a.AccountJWT}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return nil, fmt.Errorf("credentials authority: %w (made by `broker creds init --dir %s`)", err, dir)
		}
		*f.dst = strings.TrimSpace(string(b))
	}
	a.SystemAccount, _ = a.sys.PublicKey()
	a.Account, _ = a.acct.PublicKey()
	return a, nil
}

func readSeed(dir, name string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %w (made by `broker creds init --dir %s`)", err, dir)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %s: %w", filepath.Join(dir, name), err)
	}
	return kp, nil
}

// create makes an operator, a system account and the Assent account with
// JetStream enabled, and writes them to dir.
func create(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials authority: %w", err)
	}
	a := &Authority{Dir: dir}
	var err error
	if a.operator, err = nkeys.CreateOperator(); err != nil {
		return nil, err
	}
	if a.sys, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	if a.acct, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	opPub, _ := a.operator.PublicKey()
	a.SystemAccount, _ = a.sys.PublicKey()
	a.Account, _ = a.acct.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "assent"
	oc.SystemAccount = a.SystemAccount
	if a.OperatorJWT, err = oc.Encode(a.operator); err != nil {
		return nil, err
	}
	sc := jwt.NewAccountClaims(a.SystemAccount)
	sc.Name = "SYS"
	if a.SystemJWT, err = sc.Encode(a.operator); err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(a.Account)
	ac.Name = "ASSENT"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	if a.AccountJWT, err = ac.Encode(a.operator); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{operatorSeed, a.operator}, {sysSeed, a.sys}, {acctSeed, a.acct}} {
		seed, _ := f.kp.Seed()
		if err := writeFile(filepath.Join(dir, f.name), append(seed, '\n'), 0o600); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ name, jwt string }{{operatorJWT, a.OperatorJWT}, {sysJWT, a.SystemJWT}, {acctJWT, a.AccountJWT}} {
		if err := writeFile(filepath.Join(dir, f.name), []byte(f.jwt+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// writeFile writes a new file, refusing to overwrite one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("credentials authority: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Issue makes the credentials file (a user JWT and its nkey seed, the format
// nats.UserCredentials reads) for who.
func (a *Authority) Issue(who Identity) ([]byte, error) {
	token, seed, err := a.User(who)
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, []byte(seed))
}

// User makes a user for who: its JWT and nkey seed (nats.UserJWTAndSeed).
func (a *Authority) User(who Identity) (token, seed string, err error) {
	perms, err := who.Permissions()
	if err != nil {
		return "", "", err
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return "", "", err
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = string(who.Role) + ":" + who.Name
	uc.IssuerAccount = "" // signed by the account key itself
	uc.Permissions = perms
	if who.Expires > 0 {
		uc.Expires = who.Expires
	}
	if token, err = uc.Encode(a.acct); err != nil {
		return "", "", err
	}
	s, _ := user.Seed()
	return token, string(s), nil
}

// Preload is the accounts a server must know: public key -> JWT.
func (a *Authority) Preload() map[string]string {
	return map[string]string{a.SystemAccount: a.SystemJWT, a.Account: a.AccountJWT}
}

// Embedded is the trust of an embedded server in operator mode.
func (a *Authority) Embedded() *natsembed.Operator {
	return &natsembed.Operator{JWT: a.OperatorJWT, SystemAccount: a.SystemAccount, Accounts: a.Preload()}
}

// ServerOptions are the settings of a generated server configuration.
type ServerOptions struct {
	Listen   string // host:port for clients
	StoreDir string // JetStream storage
	Name     string // server_name
}

// ServerConfig is a nats-server configuration in operator mode that trusts
// a, with the accounts preloaded and JetStream on.
func (a *Authority) ServerConfig(o ServerOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# nats-server for Assent in operator mode: made by `broker creds server-config`.\n")
	fmt.Fprintf(&b, "# Clients connect with credentials from `broker creds` (docs/security.md).\n")
	fmt.Fprintf(&b, "server_name: %q\nlisten: %q\n", o.Name, o.Listen)
	fmt.Fprintf(&b, "# Room for user JWTs in CONNECT: a bot's passes the default 4 KiB.\nmax_control_line: %d\n", natsembed.MaxControlLine)
	fmt.Fprintf(&b, "# Room for an event of the broker's default 1 MiB limit and what it adds (docs/protocol.md).\nmax_payload: %d\n", natsembed.MaxPayload)
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n", o.StoreDir)
	fmt.Fprintf(&b, "  # Fsync every write before acknowledging it, as the broker's embedded server\n  # does: an acknowledged approval survives the machine going down (docs/cluster.md).\n  sync_interval: always\n}\n")
	fmt.Fprintf(&b, "operator: %q\nsystem_account: %s\n", a.OperatorJWT, a.SystemAccount)
	fmt.Fprintf(&b, "resolver: MEMORY\nresolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %q\n  %s: %q\n}\n", a.SystemAccount, a.SystemJWT, a.Account, a.AccountJWT)
	return b.String()
}
