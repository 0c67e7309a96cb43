package email

import (
	"context"
	"encoding/json"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// LinkForTest returns an approval link signed with a's secret, as Notify
// would mail it, with any fields a test wants.
func (a *Adapter) LinkForTest(id, principal, address string, d events.Verdict, args json.RawMessage, expires time.Time) string {
	digest, err := events.ArgsDigest(args)
	if err != nil {
		panic(err)
	}
	return a.s.public + linkPath + a.links.sign(link{Request: id, Principal: principal, Decision: d, Args: digest, To: addressHash(address), Expires: expires.Unix()})
}

// PageCSS is the link pages' inline style, whose hash the CSP allows.
const PageCSS = pageCSS

// MailedForTest reports whether the first mail about request id to
// principal is recorded as sent.
func (a *Adapter) MailedForTest(ctx context.Context, id, principal string) bool {
	_, err := a.st.Load().kv.Get(ctx, sentKey(id, principal, kindNew.String()))
	return err == nil
}

// ForgetMailedForTest deletes the record that the first mail about request
// id went to principal, as if the bot had died after the SMTP server took
// the mail and before it recorded it.
func (a *Adapter) ForgetMailedForTest(ctx context.Context, id, principal string) error {
	return a.st.Load().kv.Delete(ctx, sentKey(id, principal, kindNew.String()))
}
