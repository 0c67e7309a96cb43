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
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/natsembed"
)

// Authority holds the keys that sign every credential of a deployment. Its
// seeds may be kept apart: issuing needs only the signing key of the role
// (signers.go); changing the account (signing keys, revocations, limits)
// needs the operator's seed; the account's own seed is needed by nothing
// once the signing keys exist, and belongs offline.
type Authority struct {
	Dir string
	// operator, sys and acct are nil when their seeds are not in Dir.
	operator, sys, acct nkeys.KeyPair
	// signers are the account's signing keys in Dir, by kind.
	signers map[string]nkeys.KeyPair
	// OperatorJWT, SystemJWT and AccountJWT are the operator's and the two
	// accounts' JWTs, which servers load.
	OperatorJWT, SystemJWT, AccountJWT string
	// SystemAccount and Account are the accounts' public keys.
	SystemAccount, Account string
	upgraded               bool
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

// Init opens the authority in dir, making its keys first if dir holds none
// (with DefaultAccountLimits). made reports whether it did. An authority
// made before signing keys existed gets them (Upgraded), which needs its
// operator's seed.
func Init(dir string) (a *Authority, made bool, err error) {
	return InitLimits(dir, DefaultAccountLimits)
}

// InitLimits is Init with the account's limits for a new authority, and for
// one it upgrades.
func InitLimits(dir string, limits AccountLimits) (a *Authority, made bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, operatorJWT)); errors.Is(err, fs.ErrNotExist) {
		a, err := create(dir, limits)
		return a, err == nil, err
	}
	if a, err = Open(dir); err != nil {
		return nil, false, err
	}
	if a.upgraded, err = a.upgrade(limits); err != nil {
		return nil, false, err
	}
	return a, false, nil
}

// Upgraded reports whether Init gave the authority its signing keys.
func (a *Authority) Upgraded() bool { return a.upgraded }

// Open reads the authority in dir, made by Init.
func Open(dir string) (*Authority, error) {
	a := &Authority{Dir: dir, signers: map[string]nkeys.KeyPair{}}
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
	ac, err := jwt.DecodeAccountClaims(a.AccountJWT)
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %s: %w", filepath.Join(dir, acctJWT), err)
	}
	sc, err := jwt.DecodeAccountClaims(a.SystemJWT)
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %s: %w", filepath.Join(dir, sysJWT), err)
	}
	a.Account, a.SystemAccount = ac.Subject, sc.Subject
	for _, k := range []struct {
		name string
		dst  *nkeys.KeyPair
		pub  string
	}{{operatorSeed, &a.operator, ac.Issuer}, {sysSeed, &a.sys, a.SystemAccount}, {acctSeed, &a.acct, a.Account}} {
		if *k.dst, err = readSeed(dir, k.name, k.pub); err != nil {
			return nil, err
		}
	}
	for _, kind := range signerKinds {
		kp, err := readSeed(dir, filepath.Join(signerDir, kind+".nk"), "")
		if err != nil {
			return nil, err
		}
		if kp == nil {
			continue
		}
		if pub, _ := kp.PublicKey(); !ac.SigningKeys.Contains(pub) {
			return nil, fmt.Errorf("credentials authority: %s is not a signing key of the account in %s (made by another `broker creds init`?)",
				filepath.Join(dir, signerDir, kind+".nk"), acctJWT)
		}
		a.signers[kind] = kp
	}
	return a, nil
}

// readSeed reads the seed in dir/name: nil if the file is not there (a seed
// kept offline). want, if set, is the public key it must have.
func readSeed(dir, name, want string) (nkeys.KeyPair, error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %s: %w", path, err)
	}
	if pub, _ := kp.PublicKey(); want != "" && pub != want {
		return nil, fmt.Errorf("credentials authority: %s is the seed of %s, not of %s that the JWTs name", path, pub, want)
	}
	return kp, nil
}

// create makes an operator, a system account and the Assent account with
// JetStream enabled, limits and signing keys, and writes them to dir.
func create(dir string, limits AccountLimits) (*Authority, error) {
	if err := os.MkdirAll(filepath.Join(dir, signerDir), 0o700); err != nil {
		return nil, fmt.Errorf("credentials authority: %w", err)
	}
	a := &Authority{Dir: dir, signers: map[string]nkeys.KeyPair{}}
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
	for _, f := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{operatorSeed, a.operator}, {sysSeed, a.sys}, {acctSeed, a.acct}} {
		seed, _ := f.kp.Seed()
		if err := writeFile(filepath.Join(dir, f.name), append(seed, '\n'), 0o600); err != nil {
			return nil, err
		}
	}
	ac := jwt.NewAccountClaims(a.Account)
	ac.Name = "ASSENT"
	limits.apply(ac)
	if err := a.addSigners(ac); err != nil {
		return nil, err
	}
	if a.AccountJWT, err = ac.Encode(a.operator); err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, jwt string }{{operatorJWT, a.OperatorJWT}, {sysJWT, a.SystemJWT}, {acctJWT, a.AccountJWT}} {
		if err := writeFile(filepath.Join(dir, f.name), []byte(f.jwt+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// addSigners makes the signing keys ac lacks, writes their seeds, and puts
// them in ac: scoped ones with their templates.
func (a *Authority) addSigners(ac *jwt.AccountClaims) error {
	if err := os.MkdirAll(filepath.Join(a.Dir, signerDir), 0o700); err != nil {
		return fmt.Errorf("credentials authority: %w", err)
	}
	for _, kind := range signerKinds {
		if _, ok := a.signers[kind]; ok {
			continue
		}
		kp, err := nkeys.CreateAccount()
		if err != nil {
			return err
		}
		pub, _ := kp.PublicKey()
		if !scoped(kind) {
			ac.SigningKeys.Add(pub)
		} else {
			scope := jwt.NewUserScope()
			scope.Key, scope.Role = pub, kind
			scope.Description = "Assent " + kind + " users"
			if scope.Template, err = template(kind); err != nil {
				return err
			}
			ac.SigningKeys.AddScopedSigner(scope)
		}
		seed, _ := kp.Seed()
		if err := writeFile(filepath.Join(a.Dir, signerDir, kind+".nk"), append(seed, '\n'), 0o600); err != nil {
			return err
		}
		a.signers[kind] = kp
	}
	return nil
}

// upgrade gives an authority made before signing keys existed its signing
// keys and limits, re-signing the account's JWT. It reports whether it
// changed anything.
func (a *Authority) upgrade(limits AccountLimits) (bool, error) {
	if len(a.signers) == len(signerKinds) {
		return false, nil
	}
	ac, err := a.accountClaims()
	if err != nil {
		return false, err
	}
	if len(ac.SigningKeys) > 0 {
		return false, fmt.Errorf("credentials authority: %s lacks some of the account's signing keys (%s/): copy them back from where they are kept", a.Dir, signerDir)
	}
	if a.operator == nil {
		return false, fmt.Errorf("credentials authority: adding signing keys re-signs the account, which needs %s in %s", operatorSeed, a.Dir)
	}
	if ac.Limits.Conn == jwt.NoLimit {
		limits.apply(ac)
	}
	if err := a.addSigners(ac); err != nil {
		return false, err
	}
	return true, a.setAccount(ac)
}

// accountClaims decodes the account's JWT.
func (a *Authority) accountClaims() (*jwt.AccountClaims, error) {
	ac, err := jwt.DecodeAccountClaims(a.AccountJWT)
	if err != nil {
		return nil, fmt.Errorf("credentials authority: %s: %w", acctJWT, err)
	}
	return ac, nil
}

// setAccount signs ac with the operator's key and makes it the account's
// JWT, in memory and in Dir.
func (a *Authority) setAccount(ac *jwt.AccountClaims) error {
	if a.operator == nil {
		return fmt.Errorf("credentials authority: changing the account needs the operator's seed, %s, in %s: run this where it is kept", operatorSeed, a.Dir)
	}
	token, err := ac.Encode(a.operator)
	if err != nil {
		return err
	}
	if err := replaceFile(filepath.Join(a.Dir, acctJWT), []byte(token+"\n"), 0o644); err != nil {
		return err
	}
	a.AccountJWT = token
	return nil
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

// replaceFile replaces path with data at once: readers see the old file or
// the new one, never part of it.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("credentials authority: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("credentials authority: %w", err)
	}
	return nil
}

// Issue makes the credentials file (a user JWT and its nkey seed, the format
// nats.UserCredentials reads) for who, and records the user in Dir's
// register of issued users (revoke.go).
func (a *Authority) Issue(who Identity) ([]byte, error) {
	token, seed, err := a.User(who)
	if err != nil {
		return nil, err
	}
	if err := a.record(who, token); err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, []byte(seed))
}

// User makes a user for who: its JWT and nkey seed (nats.UserJWTAndSeed),
// signed by the signing key of its kind; an authority made before signing
// keys signs with the account's key.
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
	if who.Expires > 0 {
		uc.Expires = who.Expires
	}
	kind := signerOf(who)
	signer, ok := a.signers[kind]
	switch {
	case ok && scoped(kind):
		// The account's JWT says what the user may do, for the user's
		// name: the agent or principal, as the template has it.
		uc.Name = who.Name
		uc.Tags.Add("role:" + string(who.Role))
		uc.IssuerAccount = a.Account
		uc.SetScoped(true)
	case ok:
		uc.IssuerAccount = a.Account
		uc.Permissions, uc.NatsLimits = perms, roleLimits(who.Role)
	case a.acct != nil && len(a.signers) == 0:
		// Made before signing keys: the account's key signs.
		signer = a.acct
		uc.Permissions, uc.NatsLimits = perms, roleLimits(who.Role)
	default:
		return "", "", fmt.Errorf("credentials authority: no signing key for %s users in %s (%s/%s.nk): copy it back from where it is kept", kind, a.Dir, signerDir, kind)
	}
	if token, err = uc.Encode(signer); err != nil {
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
	// TLS for clients: the server's certificate and key, and, for mutual
	// TLS, the CA that signed the clients' certificates. None: plain.
	CertFile, KeyFile, ClientCAFile string
	// Cluster, if set, makes the server a node of a cluster.
	Cluster *ClusterOptions
	// MemoryResolver keeps the accounts in memory, from the preload alone:
	// account updates (revocations) then last until the server restarts,
	// unless its configuration is made again. By default a full resolver
	// keeps them in StoreDir/jwt.
	MemoryResolver bool
}

// ClusterOptions are a node's cluster settings. Routes carry every
// message between the nodes, so they are always TLS with certificates
// both ways, and authenticated by the route secret every node made from
// one authority shares (routeSecret).
type ClusterOptions struct {
	Name   string   // the cluster's name, the same on every node
	Listen string   // host:port for routes
	Routes []string // the other nodes' route host:port
	// CertFile and KeyFile are this node's route certificate (usable for
	// server and client authentication: a node both accepts and dials
	// routes); CAFile signed every node's.
	CertFile, KeyFile, CAFile string
}

// Validate reports every problem with o at once.
func (o ServerOptions) Validate() error {
	var errs []error
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("client TLS needs both the certificate and its key"))
	}
	if o.ClientCAFile != "" && o.CertFile == "" {
		errs = append(errs, errors.New("mutual TLS for clients needs the server's certificate and key too"))
	}
	if c := o.Cluster; c != nil {
		if c.Name == "" || c.Listen == "" {
			errs = append(errs, errors.New("a cluster needs its name and a route listen address"))
		}
		if c.CertFile == "" || c.KeyFile == "" || c.CAFile == "" {
			errs = append(errs, errors.New("routes carry every message between nodes: give the node's route certificate, its key and the CA that signed every node's"))
		}
		for _, r := range c.Routes {
			if _, _, err := net.SplitHostPort(r); err != nil {
				errs = append(errs, fmt.Errorf("route %q: want host:port: %w", r, err))
			}
		}
	}
	return errors.Join(errs...)
}

// routeSecretFile holds the password routes authenticate with, made once
// per authority so that every node's configuration has it.
const routeSecretFile = "route.secret"

// routeSecret returns the authority's route password, made if need be.
func (a *Authority) routeSecret() (string, error) {
	path := filepath.Join(a.Dir, routeSecretFile)
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("credentials authority: %w", err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	secret := base64.RawURLEncoding.EncodeToString(raw)
	if err := writeFile(path, []byte(secret+"\n"), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return a.routeSecret() // made meanwhile by another run
		}
		return "", err
	}
	return secret, nil
}

// ServerConfig is a nats-server configuration in operator mode that trusts
// a, with the accounts preloaded into a full resolver (which keeps the
// account updates Push sends, revocations among them, across restarts, and
// passes them to the other nodes of a cluster) and JetStream on.
func (a *Authority) ServerConfig(o ServerOptions) (string, error) {
	if err := o.Validate(); err != nil {
		return "", fmt.Errorf("server configuration: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# nats-server for Assent in operator mode: made by `broker creds server-config`.\n")
	fmt.Fprintf(&b, "# Clients connect with credentials from `broker creds` (docs/security.md).\n")
	fmt.Fprintf(&b, "server_name: %q\nlisten: %q\n", o.Name, o.Listen)
	fmt.Fprintf(&b, "# Room for user JWTs in CONNECT: a bot's passes the default 4 KiB.\nmax_control_line: %d\n", natsembed.MaxControlLine)
	fmt.Fprintf(&b, "# Room for an event of the broker's default 1 MiB limit and what it adds (docs/protocol.md).\nmax_payload: %d\n", natsembed.MaxPayload)
	if o.CertFile != "" {
		fmt.Fprintf(&b, "tls {\n  cert_file: %q\n  key_file: %q\n", o.CertFile, o.KeyFile)
		if o.ClientCAFile != "" {
			fmt.Fprintf(&b, "  # Mutual TLS: every client shows a certificate this CA signed.\n  ca_file: %q\n  verify: true\n", o.ClientCAFile)
		}
		fmt.Fprintf(&b, "  timeout: 5\n}\n")
	}
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n", o.StoreDir)
	fmt.Fprintf(&b, "  # Fsync every write before acknowledging it, as the broker's embedded server\n  # does: an acknowledged approval survives the machine going down (docs/cluster.md).\n  sync_interval: always\n}\n")
	if c := o.Cluster; c != nil {
		secret, err := a.routeSecret()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: %q\n", c.Name, c.Listen)
		fmt.Fprintf(&b, "  # Routes show a certificate the CA signed, both ways, and the route secret.\n")
		fmt.Fprintf(&b, "  tls {\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n    verify: true\n    timeout: 5\n  }\n", c.CertFile, c.KeyFile, c.CAFile)
		fmt.Fprintf(&b, "  authorization {\n    user: \"route\"\n    password: %q\n    timeout: 5\n  }\n", secret)
		fmt.Fprintf(&b, "  routes: [\n")
		for _, r := range c.Routes {
			fmt.Fprintf(&b, "    %q\n", "nats-route://route:"+secret+"@"+r)
		}
		fmt.Fprintf(&b, "  ]\n}\n")
	}
	fmt.Fprintf(&b, "operator: %q\nsystem_account: %s\n", a.OperatorJWT, a.SystemAccount)
	if o.MemoryResolver {
		fmt.Fprintf(&b, "# A memory resolver: account updates (`broker creds revoke`) last until a restart;\n# make this configuration again after one.\nresolver: MEMORY\n")
	} else {
		fmt.Fprintf(&b, "# A full resolver keeps account updates (`broker creds revoke`) across restarts.\n")
		fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %q\n  allow_delete: false\n  interval: \"2m\"\n}\n", filepath.Join(o.StoreDir, "jwt"))
	}
	fmt.Fprintf(&b, "resolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %q\n  %s: %q\n}\n", a.SystemAccount, a.SystemJWT, a.Account, a.AccountJWT)
	return b.String(), nil
}
