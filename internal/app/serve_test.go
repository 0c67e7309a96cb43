package app_test

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/envflag"
)

func TestParseServe(t *testing.T) {
	env := envflag.Map(map[string]string{
		"ASSENT_MODE":          "auto-deny",
		"ASSENT_NATS_TLS_CERT": "/tls/cert.pem",
		"ASSENT_NATS_TLS_KEY":  "/tls/key.pem",
		"ASSENT_TIMEOUT":       "90s",
		"ASSENT_LOG_JSON":      "true",
		"ASSENT_HTTP":          "127.0.0.1:9000",
	})
	var stderr bytes.Buffer
	s, err := app.ParseServe([]string{"--http", "127.0.0.1:9999"}, env, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, &stderr)
	}
	o := s.Options
	if o.Broker.Mode != broker.ModeAutoDeny || o.NATSTLS == nil || o.NATSTLS.CertFile != "/tls/cert.pem" || o.NATSTLS.KeyFile != "/tls/key.pem" ||
		o.Broker.DefaultTimeout != 90*time.Second || !s.LogJSON || s.LogLevel != "info" || o.HTTPListen != "127.0.0.1:9999" || o.DataDir != "./assent-data" ||
		o.GC.Floor != app.DefaultGCFloor || o.GC.Headroom != 0 {
		t.Errorf("%+v", s)
	}
	for v, want := range map[string]uint64{"0": 0, "64": 64 << 20} {
		s, err := app.ParseServe([]string{"--gc-floor", v}, envflag.Env{}, &stderr)
		if err != nil || s.Options.GC.Floor != want || s.Options.GC.Headroom != 0 {
			t.Errorf("--gc-floor %s: %+v, %v; want a floor of %d bytes", v, s.Options.GC, err, want)
		}
		s, err = app.ParseServe(nil, envflag.Map(map[string]string{"ASSENT_GC_HEADROOM": v}), &stderr)
		if err != nil || s.Options.GC.Headroom != want || s.Options.GC.Floor != app.DefaultGCFloor {
			t.Errorf("ASSENT_GC_HEADROOM=%s: %+v, %v; want a headroom of %d bytes", v, s.Options.GC, err, want)
		}
	}

	for _, tt := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"a bad mode", nil, map[string]string{"ASSENT_MODE": "maybe"}, "maybe"},
		{"a bad duration", nil, map[string]string{"ASSENT_RETENTION": "30d"}, "ASSENT_RETENTION, for --retention: want a duration"},
		{"a missing decision key", nil, map[string]string{"ASSENT_DECISION_KEY": "/no/such/seed"}, "ASSENT_DECISION_KEY, for --decision-key: want a file"},
		{"an argument", []string{"serve"}, nil, `unexpected argument "serve"`},
		{"a heap floor with a unit", nil, map[string]string{"ASSENT_GC_FLOOR": "256MiB"}, "ASSENT_GC_FLOOR, for --gc-floor: want a size: a whole number of MiB"},
		{"a negative headroom", []string{"--gc-headroom", "-1"}, nil, `invalid value "-1" for flag -gc-headroom: a whole number of MiB`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := app.ParseServe(tt.args, envflag.Map(tt.vars), &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want one with %q", err, tt.want)
			}
		})
	}

	stderr.Reset()
	if _, err := app.ParseServe([]string{"-h"}, envflag.Env{}, &stderr); err != flag.ErrHelp || !strings.Contains(stderr.String(), "(env ASSENT_NATS_URL)") {
		t.Errorf("-h: %v\n%s", err, &stderr)
	}
}
