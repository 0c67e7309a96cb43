package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/pkg/events"
)

// ErrTokenExists and ErrNoToken are returned by CreateToken and RevokeToken.
var (
	ErrTokenExists = errors.New("a token with that name exists")
	ErrNoToken     = errors.New("no token with that name")
)

// CreateToken makes a new API token called name, answering as principal
// and/or asking for agent and/or, with admin, reading and cancelling
// everything (Token.Admin), records its hash in the auth file at path (made if
// missing), and returns the token. The file keeps its comments and other
// content and is replaced at once, so a running broker never reads half of
// it.
func CreateToken(path, name, principal, agent string, admin bool, now time.Time) (string, error) {
	var errs []error
	if !events.ValidToken(name) {
		errs = append(errs, fmt.Errorf("name %q: want 1-128 characters of A-Z a-z 0-9 _ -", name))
	}
	if principal == "" && agent == "" && !admin {
		errs = append(errs, errors.New("want --principal (who answers), --agent (who asks), --admin (who reads and cancels everything), or a mix"))
	}
	for what, v := range map[string]string{"principal": principal, "agent": agent} {
		if v != "" && !events.ValidToken(v) {
			errs = append(errs, fmt.Errorf("%s %q: want 1-128 characters of A-Z a-z 0-9 _ -", what, v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	token, hash := NewToken()
	err := editFile(path, func(cfg *Config, tokens *yaml.Node) error {
		for _, t := range cfg.Tokens {
			if t.Name == name {
				return fmt.Errorf("%w: %s (revoke it first, or pick another name)", ErrTokenExists, name)
			}
		}
		entry := &yaml.Node{Kind: yaml.MappingNode}
		add := func(k, v string) {
			entry.Content = append(entry.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &yaml.Node{Kind: yaml.ScalarNode, Value: v})
		}
		add("name", name)
		if principal != "" {
			add("principal", principal)
		}
		if agent != "" {
			add("agent", agent)
		}
		if admin {
			add("admin", "true")
		}
		add("hash", hash)
		add("created", now.UTC().Format(time.RFC3339))
		tokens.Content = append(tokens.Content, entry)
		return nil
	})
	if err != nil {
		return "", err
	}
	return token, nil
}

// RevokeToken removes the token called name from the auth file at path. A
// running broker stops accepting it when it next reads the file (within
// seconds).
func RevokeToken(path, name string) error {
	return editFile(path, func(_ *Config, tokens *yaml.Node) error {
		for i, item := range tokens.Content {
			for j := 0; j+1 < len(item.Content); j += 2 {
				if item.Content[j].Value == "name" && item.Content[j+1].Value == name {
					tokens.Content = append(tokens.Content[:i], tokens.Content[i+1:]...)
					return nil
				}
			}
		}
		return fmt.Errorf("%w: %s", ErrNoToken, name)
	})
}

// editFile applies edit to the tokens list of the auth file at path, and
// writes the file back atomically with its mode. A file with problems is not
// edited.
func editFile(path string, edit func(cfg *Config, tokens *yaml.Node) error) error {
	data, err := os.ReadFile(path)
	mode := fs.FileMode(0o600)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	}
	cfg, err := Parse(data, path)
	if err != nil {
		return fmt.Errorf("fix the auth file first: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	root := doc.Content[0]
	var tokens *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "tokens" {
			tokens = root.Content[i+1]
		}
	}
	if tokens == nil || tokens.Kind != yaml.SequenceNode {
		list := &yaml.Node{Kind: yaml.SequenceNode}
		if tokens != nil { // "tokens:" with nothing after it
			*tokens = *list
		} else {
			root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "tokens"}, list)
			tokens = list
		}
	}
	if err := edit(cfg, tokens); err != nil {
		return err
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if _, err := Parse(out.Bytes(), path); err != nil {
		return fmt.Errorf("the edited auth file would not load: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".auth-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(out.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
