// Package logging builds the zap loggers of Assent's commands.
package logging

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger writing to stderr at level ("debug", "info", "warn",
// "error"), as console text or, with asJSON, JSON lines.
func New(level string, asJSON bool) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	if !asJSON {
		cfg.Encoding = "console"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	cfg.EncoderConfig.EncodeDuration = zapcore.StringDurationEncoder
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	cfg.DisableStacktrace = true
	cfg.Sampling = nil
	return cfg.Build()
}
