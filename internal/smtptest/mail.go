package smtptest

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	netmail "net/mail"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Mail is a delivered message, parsed: a multipart/alternative of a text
// and an HTML part, as the email channel sends.
type Mail struct {
	Delivery
	Header  netmail.Header
	Subject string
	Text    string
	HTML    string
}

// Approve and Deny return the mail's links, checking that both parts carry
// the same ones.
func (m Mail) Approve(t testing.TB) string { t.Helper(); return m.link(t, "Approve") }
func (m Mail) Deny(t testing.TB) string    { t.Helper(); return m.link(t, "Deny") }

func (m Mail) link(t testing.TB, label string) string {
	t.Helper()
	got := regexp.MustCompile(`(?m)^` + label + `: +(\S+)$`).FindStringSubmatch(m.Text)
	if got == nil {
		t.Fatalf("no %s link in the text part:\n%s", label, m.Text)
	}
	u := got[1]
	if !strings.Contains(m.HTML, `href="`+u+`"`) {
		t.Fatalf("the HTML part lacks the %s link %s", label, u)
	}
	return u
}

// Parse reads a delivered message, failing the test unless it is a
// multipart/alternative of a UTF-8 text and HTML part.
func Parse(t testing.TB, d Delivery) Mail {
	t.Helper()
	msg, err := netmail.ReadMessage(bytes.NewReader(d.Data))
	if err != nil {
		t.Fatal(err)
	}
	m := Mail{Delivery: d, Header: msg.Header}
	if m.Subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject")); err != nil {
		t.Fatal(err)
	}
	media, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || media != "multipart/alternative" {
		t.Fatalf("Content-Type %q: want multipart/alternative", msg.Header.Get("Content-Type"))
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	for {
		part, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		media, params, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
		if err != nil || !strings.EqualFold(params["charset"], "utf-8") {
			t.Fatalf("part Content-Type %q: want a UTF-8 charset", part.Header.Get("Content-Type"))
		}
		body, err := io.ReadAll(part) // quoted-printable is decoded by the reader
		if err != nil {
			t.Fatal(err)
		}
		switch media {
		case "text/plain":
			m.Text = strings.ReplaceAll(string(body), "\r\n", "\n")
		case "text/html":
			m.HTML = string(body)
		default:
			t.Fatalf("unexpected part %s", media)
		}
	}
	if m.Text == "" || m.HTML == "" {
		t.Fatalf("want a text and an HTML part; text %d bytes, HTML %d bytes", len(m.Text), len(m.HTML))
	}
	return m
}

// About matches the mails to addr about request id: the email channel's
// Message-IDs are <assent.ID.…>.
func About(addr, id string) func(Delivery) bool {
	return func(d Delivery) bool {
		return slices.ContainsFunc(d.To, func(to string) bool { return strings.EqualFold(to, addr) }) &&
			bytes.Contains(d.Data, []byte("<assent."+id+"."))
	}
}

// MailsAbout waits for n mails to addr about request id, and returns all of
// them so far, parsed.
func (s *Server) MailsAbout(t testing.TB, addr, id string, n int) []Mail {
	t.Helper()
	ds := s.Wait(t, addr, n, About(addr, id))
	out := make([]Mail, len(ds))
	for i, d := range ds {
		out[i] = Parse(t, d)
	}
	return out
}
