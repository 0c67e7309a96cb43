package human_test

import (
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/human"
)

func TestParseSpan(t *testing.T) {
	day := 24 * time.Hour
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"7d", 7 * day, false},
		{"24h", 24 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"1d12h", 36 * time.Hour, false},
		{"2w", 14 * day, false},
		{"1.5d", 36 * time.Hour, false},
		{"1h30m", 90 * time.Minute, false},
		{"", 0, true},
		{"7", 0, true},
		{"d", 0, true},
		{"0d", 0, true},
		{"-7d", 0, true},
		{"7y", 0, true},
		{"7 d", 0, true},
		{"1..2d", 0, true},
		{"99999999999w", 0, true},
	}
	for _, tt := range tests {
		got, err := human.ParseSpan(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSpan(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
