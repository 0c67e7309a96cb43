package envflag_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/envflag"
)

func TestVar(t *testing.T) {
	for flagName, want := range map[string]string{
		"nats-url":           "ASSENT_NATS_URL",
		"n":                  "ASSENT_N",
		"trust-decision-key": "ASSENT_TRUST_DECISION_KEY",
		"log-json":           "ASSENT_LOG_JSON",
	} {
		if got := envflag.Var(flagName); got != want {
			t.Errorf("Var(%q) = %q, want %q", flagName, got, want)
		}
	}
}

// settings is a command's flags of every kind.
type settings struct {
	url     string
	json    bool
	timeout time.Duration
	n       int
	keys    []string
}

func newFlagSet(s *settings) *flag.FlagSet {
	fs := flag.NewFlagSet("prog cmd", flag.ContinueOnError)
	fs.StringVar(&s.url, "nats-url", "nats://127.0.0.1:4222", "NATS server `URL`")
	fs.BoolVar(&s.json, "json", false, "print JSON")
	fs.DurationVar(&s.timeout, "timeout", time.Minute, "how long to wait")
	fs.IntVar(&s.n, "n", 10, "how many")
	fs.Func("trust-decision-key", "a decision `key`; repeatable, or comma-separated", func(v string) error {
		for k := range strings.SplitSeq(v, ",") {
			if !strings.HasPrefix(k, "A") {
				return errBadKey
			}
			s.keys = append(s.keys, k)
		}
		return nil
	})
	return fs
}

var errBadKey = flagError("not a public account key (A...)")

type flagError string

func (e flagError) Error() string { return string(e) }

// parse parses args with env into a new flag set; stderr has what the flag
// set printed (errors, usage), warnings what Parse warned of.
func parse(t *testing.T, args []string, vars map[string]string) (s settings, err error, stderr, warnings string) {
	t.Helper()
	fs := newFlagSet(&s)
	var out, warn bytes.Buffer
	fs.SetOutput(&out)
	err = envflag.Parse(fs, args, envflag.Map(vars), &warn)
	return s, err, out.String(), warn.String()
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParse(t *testing.T) {
	secret := writeFile(t, "nats://from-file:4222\n")
	twoLines := writeFile(t, "nats://a:4222\n\n")
	keyFile := writeFile(t, "AKEY1,AKEY2")
	tests := []struct {
		name string
		args []string
		vars map[string]string
		want settings
	}{
		{"defaults", nil, nil, settings{url: "nats://127.0.0.1:4222", timeout: time.Minute, n: 10}},
		{"every kind from the environment", nil, map[string]string{
			"ASSENT_NATS_URL": "nats://env:4222", "ASSENT_JSON": "true", "ASSENT_TIMEOUT": "90s",
			"ASSENT_N": "7", "ASSENT_TRUST_DECISION_KEY": "AKEY1,AKEY2",
		}, settings{url: "nats://env:4222", json: true, timeout: 90 * time.Second, n: 7, keys: []string{"AKEY1", "AKEY2"}}},
		{"the command line wins", []string{"--nats-url", "nats://cli:4222", "--json=false", "--n", "3", "--trust-decision-key", "ACLI"}, map[string]string{
			"ASSENT_NATS_URL": "nats://env:4222", "ASSENT_JSON": "true", "ASSENT_N": "7", "ASSENT_TRUST_DECISION_KEY": "AENV",
		}, settings{url: "nats://cli:4222", timeout: time.Minute, n: 3, keys: []string{"ACLI"}}},
		{"from a file, less one newline", nil, map[string]string{"ASSENT_NATS_URL_FILE": secret},
			settings{url: "nats://from-file:4222", timeout: time.Minute, n: 10}},
		{"only one newline trimmed", nil, map[string]string{"ASSENT_NATS_URL_FILE": twoLines},
			settings{url: "nats://a:4222\n", timeout: time.Minute, n: 10}},
		{"a repeatable flag from a file", nil, map[string]string{"ASSENT_TRUST_DECISION_KEY_FILE": keyFile},
			settings{url: "nats://127.0.0.1:4222", timeout: time.Minute, n: 10, keys: []string{"AKEY1", "AKEY2"}}},
		{"an empty value is a value", nil, map[string]string{"ASSENT_NATS_URL": ""},
			settings{timeout: time.Minute, n: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err, stderr, warnings := parse(t, tt.args, tt.vars)
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, stderr)
			}
			if got.url != tt.want.url || got.json != tt.want.json || got.timeout != tt.want.timeout || got.n != tt.want.n || !slices.Equal(got.keys, tt.want.keys) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if warnings != "" {
				t.Errorf("warnings: %s", warnings)
			}
		})
	}
}

// A flag set from the environment counts as set (flag.Visit), as one given
// on the command line does: programs that let given flags override a
// configuration file treat both alike.
func TestParseVisit(t *testing.T) {
	var s settings
	fs := newFlagSet(&s)
	if err := envflag.Parse(fs, []string{"--n", "1"}, envflag.Map(map[string]string{"ASSENT_JSON": "1"}), nil); err != nil {
		t.Fatal(err)
	}
	var set []string
	fs.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
	if !slices.Equal(set, []string{"json", "n"}) {
		t.Errorf("set flags %v, want [json n]", set)
	}
}

func TestParseErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		vars map[string]string
		want []string // in the error, and on the flag set's output before the usage
	}{
		{"both set", map[string]string{"ASSENT_NATS_URL": "nats://a", "ASSENT_NATS_URL_FILE": "/x"},
			[]string{"both ASSENT_NATS_URL and ASSENT_NATS_URL_FILE are set, for --nats-url: unset one"}},
		{"a bad bool", map[string]string{"ASSENT_JSON": "yes"}, []string{"ASSENT_JSON, for --json: want true or false"}},
		{"a bad duration", map[string]string{"ASSENT_TIMEOUT": "5"}, []string{"ASSENT_TIMEOUT, for --timeout: want a duration such as 90s, 5m or 1h30m"}},
		{"a bad int", map[string]string{"ASSENT_N": "ten"}, []string{"ASSENT_N, for --n: want a whole number"}},
		{"a bad Func value", map[string]string{"ASSENT_TRUST_DECISION_KEY": "NKEY"}, []string{"ASSENT_TRUST_DECISION_KEY, for --trust-decision-key: want a key: not a public account key (A...)"}},
		{"a missing file", map[string]string{"ASSENT_NATS_URL_FILE": missing}, []string{"ASSENT_NATS_URL_FILE, for --nats-url: open " + missing}},
		{"a bad value from a file", map[string]string{"ASSENT_N_FILE": writeFile(t, "ten\n")}, []string{"ASSENT_N_FILE (", "), for --n: want a whole number"}},
		{"every problem at once", map[string]string{"ASSENT_N": "ten", "ASSENT_JSON": "yes"}, []string{"ASSENT_N, for --n", "ASSENT_JSON, for --json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err, stderr, _ := parse(t, nil, tt.vars)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			msg, usage, _ := strings.Cut(stderr, "Usage of prog cmd:")
			if !strings.Contains(msg, err.Error()) || !strings.Contains(usage, "-nats-url") {
				t.Errorf("output is not the error, then the usage:\n%s", stderr)
			}
		})
	}
}

// A bad command line is fs.Parse's error, and the environment is not read.
func TestParseCommandLineError(t *testing.T) {
	_, err, stderr, warnings := parse(t, []string{"--nats-urll", "x"}, map[string]string{"ASSENT_N": "ten", "ASSENT_NOPE": "1"})
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -nats-urll") {
		t.Errorf("err %v", err)
	}
	if strings.Contains(stderr, "ASSENT_N") || warnings != "" {
		t.Errorf("the environment was read:\n%s%s", stderr, warnings)
	}
}

func TestParseUnknownVariables(t *testing.T) {
	_, err, _, warnings := parse(t, nil, map[string]string{
		"ASSENT_NATS_URLL":                    "nats://typo",      // a slip
		"ASSENT_TIMEOUT_FILE":                 writeFile(t, "1m"), // a flag's file: fine
		"ASSENT_NATS_CREDS":                   "/creds",           // another program's flag: not warned of
		"ASSENT_DECISION_KEY":                 "AKEY",             // another command's flag, within this one's
		"ASSENT_POLICY_FILE":                  "/path",            // another program's flag's file
		"ASSENT_DECISION_KY":                  "AKEY",             // a slip, near no flag of this command
		"ASSENT_POLICYY":                      "/policy.yaml",     // a slip near none of this command's
		"ASSENT_TOKEN":                        "secret",           // one of Others
		"ASSENT_SMTP_PASSWORD":                "secret",
		"NATS_URL":                            "nats://other", // not Assent's
		"ASSENT_JSON":                         "true",
		"ASSENT_TRUST_DECISION_KEY_FILE_FILE": "x",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"prog cmd: warning: ASSENT_DECISION_KY names no flag of any of Assent's programs; it is ignored\n",
		"prog cmd: warning: ASSENT_NATS_URLL names no flag of any of Assent's programs; it is ignored (did you mean ASSENT_NATS_URL, for --nats-url?)\n",
		"prog cmd: warning: ASSENT_POLICYY names no flag of any of Assent's programs; it is ignored\n",
		"prog cmd: warning: ASSENT_TRUST_DECISION_KEY_FILE_FILE names no flag of any of Assent's programs; it is ignored (did you mean ASSENT_TRUST_DECISION_KEY, for --trust-decision-key?)\n",
	}
	if warnings != strings.Join(want, "") {
		t.Errorf("warnings:\n%s\nwant:\n%s", warnings, strings.Join(want, ""))
	}
}

func TestPrintDefaults(t *testing.T) {
	var s settings
	fs := newFlagSet(&s)
	if err := envflag.Parse(fs, []string{"--timeout", "5s"}, envflag.Env{}, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	fs.SetOutput(&out)
	envflag.PrintDefaults(fs)
	for _, want := range []string{
		"  -nats-url URL\n    \tNATS server URL (env ASSENT_NATS_URL) (default \"nats://127.0.0.1:4222\")\n",
		"  -json\n    \tprint JSON (env ASSENT_JSON)\n",
		// The default, not the value the flag has now.
		"  -timeout duration\n    \thow long to wait (env ASSENT_TIMEOUT) (default 1m0s)\n",
		"  -trust-decision-key key\n    \ta decision key; repeatable, or comma-separated (env ASSENT_TRUST_DECISION_KEY)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
	// The flag set itself is unchanged.
	if u := fs.Lookup("json").Usage; u != "print JSON" {
		t.Errorf("usage changed to %q", u)
	}
}
