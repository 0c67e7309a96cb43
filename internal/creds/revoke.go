package creds

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// A credential is cut off before it expires by revoking its user: the
// account's JWT lists the user's public key with the time of the
// revocation, and a server that has that JWT refuses the user's
// connections from then on and closes those it has. The JWT changes in Dir
// and is pushed to the running servers through the system account, with
// no restart.

// issuedFile is Dir's register of issued users, a JSON object a line.
const issuedFile = "issued.jsonl"

// Issued is a user the authority issued credentials to.
type Issued struct {
	At      time.Time `json:"at"`
	Role    Role      `json:"role"`
	Name    string    `json:"name"`
	User    string    `json:"user"`              // the user's public key (U...)
	Expires int64     `json:"expires,omitempty"` // Unix seconds; 0: never
}

// record adds the user of token, issued to who, to Dir's register.
func (a *Authority) record(who Identity, token string) error {
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return err
	}
	line, err := json.Marshal(Issued{At: time.Now().UTC().Truncate(time.Second), Role: who.Role, Name: who.Name, User: uc.Subject, Expires: who.Expires})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(a.Dir, issuedFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("credentials authority: the register of issued users: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("credentials authority: the register of issued users: %w", err)
	}
	return f.Close()
}

// IssuedUsers lists the users Dir's register holds, oldest first.
func (a *Authority) IssuedUsers() ([]Issued, error) {
	f, err := os.Open(filepath.Join(a.Dir, issuedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Issued
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var u Issued
		if err := json.Unmarshal(sc.Bytes(), &u); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", filepath.Join(a.Dir, issuedFile), n, err)
		}
		out = append(out, u)
	}
	return out, sc.Err()
}

// Revoked reports when the account's JWT revoked user, if it did.
func (a *Authority) Revoked(user string) (time.Time, bool) {
	ac, err := a.accountClaims()
	if err != nil {
		return time.Time{}, false
	}
	at, ok := ac.Revocations[user]
	return time.Unix(at, 0), ok
}

// Revoke revokes users (public keys, U...): the account's JWT refuses
// every credential of theirs issued up to now. It needs the operator's
// seed. Push then tells the servers.
func (a *Authority) Revoke(users ...string) error {
	if len(users) == 0 {
		return errors.New("revoke: name at least one user")
	}
	ac, err := a.accountClaims()
	if err != nil {
		return err
	}
	// A credential issued in this second is revoked too: the server
	// compares seconds, and refuses what was issued at or before.
	now := time.Now()
	for _, u := range users {
		if !nkeys.IsValidPublicUserKey(u) {
			return fmt.Errorf("revoke: %q is not a user's public key (U..., 56 characters)", u)
		}
		ac.RevokeAt(u, now)
	}
	return a.setAccount(ac)
}

// UserOf returns the user's public key in a credentials file.
func UserOf(credsFile []byte) (string, error) {
	token, err := jwt.ParseDecoratedJWT(credsFile)
	if err != nil {
		return "", fmt.Errorf("not a credentials file: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", fmt.Errorf("not a credentials file: %w", err)
	}
	return uc.Subject, nil
}

// SystemUser makes a user of the system account, valid for ttl: what Push
// connects as. It needs the system account's seed.
func (a *Authority) SystemUser(ttl time.Duration) (token, seed string, err error) {
	if a.sys == nil {
		return "", "", fmt.Errorf("credentials authority: a system user is signed with %s, which is not in %s: give credentials of a system user instead", sysSeed, a.Dir)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return "", "", err
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "assent-creds"
	uc.Expires = time.Now().Add(ttl).Unix()
	if token, err = uc.Encode(a.sys); err != nil {
		return "", "", err
	}
	s, _ := user.Seed()
	return token, string(s), nil
}

// Push sends the account's JWT to the servers nc (a system account user's
// connection) reaches, which apply it at once: revocations close the
// revoked users' connections. It returns the server's answer.
func (a *Authority) Push(ctx context.Context, nc *nats.Conn) (string, error) {
	subject := fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CLAIMS.UPDATE", a.Account)
	msg, err := nc.RequestWithContext(ctx, subject, []byte(a.AccountJWT))
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return "", fmt.Errorf("push the account: no server answered on %s: is the connection a system account user's?", subject)
		}
		return "", fmt.Errorf("push the account: %w", err)
	}
	var res struct {
		Data struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"data"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return "", fmt.Errorf("push the account: the server's answer %q: %w", msg.Data, err)
	}
	if res.Error != nil {
		return "", fmt.Errorf("push the account: the server refused it: %s (%d)", res.Error.Description, res.Error.Code)
	}
	return res.Data.Message, nil
}
