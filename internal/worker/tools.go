package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Errors about tools and their arguments; branch on them with errors.Is.
var (
	// ErrUnknownTool: the tool is not one of Tools().
	ErrUnknownTool = errors.New("unknown tool")
	// ErrMissingArg: a required argument is absent or empty.
	ErrMissingArg = errors.New("missing required argument")
	// ErrBadArg: an argument has the wrong type, is not known to the tool, or
	// the args are not a JSON object.
	ErrBadArg = errors.New("bad argument")
	// ErrNotFile: the tool works on files and the path names a directory (or
	// the other way round for list_files).
	ErrNotFile = errors.New("not a regular file")
	// ErrExists: move_file's destination exists and overwrite is not set.
	ErrExists = errors.New("destination exists")
	// ErrTooLarge: read_file's file is larger than MaxReadSize.
	ErrTooLarge = errors.New("file too large")
)

// Limits of the tools.
const (
	// MaxReadSize bounds what read_file returns.
	MaxReadSize = 1 << 20
	// MaxListEntries bounds what list_files returns.
	MaxListEntries = 10000
)

// Tool names.
const (
	ToolListFiles  = "list_files"
	ToolReadFile   = "read_file"
	ToolWriteFile  = "write_file"
	ToolDeleteFile = "delete_file"
	ToolMoveFile   = "move_file"
)

// call is one parsed tool call, ready to run in a sandbox.
type call interface {
	paths() []string
	run(ctx context.Context, s *Sandbox) (Result, error)
}

// tools maps each tool name to the parser of its args.
var tools = map[string]func(json.RawMessage) (call, error){
	ToolListFiles:  parseArgs[listArgs],
	ToolReadFile:   parseArgs[readArgs],
	ToolWriteFile:  parseArgs[writeArgs],
	ToolDeleteFile: parseArgs[deleteArgs],
	ToolMoveFile:   parseArgs[moveArgs],
}

// Tools returns the names of the tools a plan may use, sorted.
func Tools() []string {
	names := make([]string, 0, len(tools))
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// CheckArgs parses args for tool without touching the disk. Errors wrap
// ErrUnknownTool, ErrMissingArg or ErrBadArg.
func CheckArgs(tool string, args json.RawMessage) error {
	_, err := parseCall(tool, args)
	return err
}

func parseCall(tool string, args json.RawMessage) (call, error) {
	parse, ok := tools[tool]
	if !ok {
		return nil, fmt.Errorf("%w %q (want one of %s)", ErrUnknownTool, tool, strings.Join(Tools(), ", "))
	}
	return parse(args)
}

// Check parses args for tool and resolves every path in them, without
// changing anything: what Exec would refuse before it starts, Check refuses.
func (s *Sandbox) Check(tool string, args json.RawMessage) error {
	c, err := parseCall(tool, args)
	if err != nil {
		return err
	}
	for _, p := range c.paths() {
		if _, err := s.Resolve(p); err != nil {
			return err
		}
	}
	return nil
}

// Exec runs tool with args in the sandbox and returns what it did. Errors
// wrap the sentinels of CheckArgs and Resolve, ErrNotFile, ErrExists,
// ErrTooLarge, or the file system's own (fs.ErrNotExist, ...).
func (s *Sandbox) Exec(ctx context.Context, tool string, args json.RawMessage) (Result, error) {
	c, err := parseCall(tool, args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res, err := c.run(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	return res, nil
}

// validator is an args struct that checks its required fields.
type validator interface{ validate() error }

// parseArgs decodes raw into a T strictly: unknown arguments (names are
// matched exactly, not case-insensitively as encoding/json would) and wrong
// types are errors, so a typo in an approver's edit cannot slip through.
func parseArgs[T any, PT interface {
	*T
	call
	validator
}](raw json.RawMessage) (call, error) {
	var v T
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		trimmed = []byte("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: args must be a JSON object", ErrBadArg)
	}
	known := argNames(reflect.TypeFor[T]())
	var unknown []string
	for name := range fields {
		if !slices.Contains(known, name) {
			unknown = append(unknown, strconv.Quote(name))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("%w: unknown argument %s (known: %s)", ErrBadArg, strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	if err := json.Unmarshal(trimmed, &v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%w: %q must be %s, not %s", ErrBadArg, te.Field, jsonKind(te.Type), te.Value)
		}
		return nil, fmt.Errorf("%w: %v", ErrBadArg, err)
	}
	if err := PT(&v).validate(); err != nil {
		return nil, err
	}
	return PT(&v), nil
}

// argNames lists the JSON names of t's fields.
func argNames(t reflect.Type) []string {
	names := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return "a " + t.Kind().String()
}

func missing(names ...string) error {
	errs := make([]error, len(names))
	for i, n := range names {
		errs[i] = fmt.Errorf("%w %q", ErrMissingArg, n)
	}
	return errors.Join(errs...)
}

// Result is what a tool did. It marshals to JSON for --json output.
type Result interface {
	// Summary is a one-line description for people.
	Summary() string
}

// Entry is one item list_files found.
type Entry struct {
	Path string `json:"path"` // relative to the sandbox root, slash-separated
	Size int64  `json:"size"`
	Dir  bool   `json:"dir,omitempty"`
	Link bool   `json:"link,omitempty"`
}

// ListResult is list_files' result.
type ListResult struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated,omitempty"`
}

// Summary lists up to eight entries.
func (r *ListResult) Summary() string {
	names := make([]string, 0, 8)
	for i, e := range r.Entries {
		if i == 8 {
			names = append(names, fmt.Sprintf("... %d more", len(r.Entries)-8))
			break
		}
		n := e.Path
		if e.Dir {
			n += "/"
		}
		names = append(names, n)
	}
	more := ""
	if r.Truncated {
		more = " (truncated)"
	}
	return fmt.Sprintf("%s: %d entries%s: %s", r.Path, len(r.Entries), more, strings.Join(names, ", "))
}

// ReadResult is read_file's result.
type ReadResult struct {
	Path    string `json:"path"`
	Size    int    `json:"size"`
	Content string `json:"content"`
}

// Summary gives the size and the start of the content.
func (r *ReadResult) Summary() string {
	preview := r.Content
	if len(preview) > 60 {
		preview = preview[:60] + "..."
	}
	return fmt.Sprintf("read %s (%d bytes): %q", r.Path, r.Size, preview)
}

// WriteResult is write_file's result.
type WriteResult struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// Summary says what was written.
func (r *WriteResult) Summary() string { return fmt.Sprintf("wrote %d bytes to %s", r.Bytes, r.Path) }

// DeleteResult is delete_file's result.
type DeleteResult struct {
	Path string `json:"path"`
}

// Summary says what was deleted.
func (r *DeleteResult) Summary() string { return "deleted " + r.Path }

// MoveResult is move_file's result.
type MoveResult struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Summary says what moved where.
func (r *MoveResult) Summary() string { return fmt.Sprintf("moved %s to %s", r.From, r.To) }

// listArgs: {"path": "dir" (default "."), "recursive": false}.
type listArgs struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

func (a *listArgs) validate() error {
	if a.Path == "" {
		a.Path = "."
	}
	return nil
}

func (a *listArgs) paths() []string { return []string{a.Path} }

func (a *listArgs) run(ctx context.Context, s *Sandbox) (Result, error) {
	rel, err := s.Resolve(a.Path)
	if err != nil {
		return nil, err
	}
	fi, err := s.root.Stat(rel)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: it is a file, list_files wants a directory", a.Path, ErrNotFile)
	}
	res := &ListResult{Path: filepath.ToSlash(rel), Entries: []Entry{}}
	fsys := s.root.FS()
	err = fs.WalkDir(fsys, filepath.ToSlash(rel), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == filepath.ToSlash(rel) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(res.Entries) == MaxListEntries {
			res.Truncated = true
			return fs.SkipAll
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Path: p, Dir: d.IsDir(), Link: d.Type()&fs.ModeSymlink != 0}
		if !e.Dir {
			e.Size = info.Size()
		}
		res.Entries = append(res.Entries, e)
		if d.IsDir() && !a.Recursive {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// readArgs: {"path": "file"}.
type readArgs struct {
	Path string `json:"path"`
}

func (a *readArgs) validate() error {
	if a.Path == "" {
		return missing("path")
	}
	return nil
}

func (a *readArgs) paths() []string { return []string{a.Path} }

func (a *readArgs) run(_ context.Context, s *Sandbox) (Result, error) {
	rel, err := s.Resolve(a.Path)
	if err != nil {
		return nil, err
	}
	f, err := s.root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", a.Path, ErrNotFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxReadSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReadSize {
		return nil, fmt.Errorf("%s: %w: more than %d bytes", a.Path, ErrTooLarge, MaxReadSize)
	}
	return &ReadResult{Path: filepath.ToSlash(rel), Size: len(b), Content: string(b)}, nil
}

// writeArgs: {"path": "file", "content": "text"}. Content may be empty but
// must be given. Missing parent directories are created.
type writeArgs struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
}

func (a *writeArgs) validate() error {
	var names []string
	if a.Path == "" {
		names = append(names, "path")
	}
	if a.Content == nil {
		names = append(names, "content")
	}
	return missing(names...)
}

func (a *writeArgs) paths() []string { return []string{a.Path} }

func (a *writeArgs) run(_ context.Context, s *Sandbox) (Result, error) {
	rel, err := s.fileTarget(a.Path)
	if err != nil {
		return nil, err
	}
	if dir := filepath.Dir(rel); dir != "." {
		if err := s.root.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := s.root.WriteFile(rel, []byte(*a.Content), 0o644); err != nil {
		return nil, err
	}
	return &WriteResult{Path: filepath.ToSlash(rel), Bytes: len(*a.Content)}, nil
}

// deleteArgs: {"path": "file"}. Directories are refused.
type deleteArgs struct {
	Path string `json:"path"`
}

func (a *deleteArgs) validate() error {
	if a.Path == "" {
		return missing("path")
	}
	return nil
}

func (a *deleteArgs) paths() []string { return []string{a.Path} }

func (a *deleteArgs) run(_ context.Context, s *Sandbox) (Result, error) {
	rel, err := s.fileTarget(a.Path)
	if err != nil {
		return nil, err
	}
	fi, err := s.root.Lstat(rel)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: delete_file does not remove directories", a.Path, ErrNotFile)
	}
	if err := s.root.Remove(rel); err != nil {
		return nil, err
	}
	return &DeleteResult{Path: filepath.ToSlash(rel)}, nil
}

// moveArgs: {"from": "file", "to": "file", "overwrite": false}. Missing
// parent directories of "to" are created; directories are not moved.
type moveArgs struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite"`
}

func (a *moveArgs) validate() error {
	var names []string
	if a.From == "" {
		names = append(names, "from")
	}
	if a.To == "" {
		names = append(names, "to")
	}
	return missing(names...)
}

func (a *moveArgs) paths() []string { return []string{a.From, a.To} }

func (a *moveArgs) run(_ context.Context, s *Sandbox) (Result, error) {
	from, err := s.fileTarget(a.From)
	if err != nil {
		return nil, err
	}
	to, err := s.fileTarget(a.To)
	if err != nil {
		return nil, err
	}
	fi, err := s.root.Lstat(from)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: move_file does not move directories", a.From, ErrNotFile)
	}
	if dst, err := s.root.Lstat(to); err == nil {
		if dst.IsDir() {
			return nil, fmt.Errorf("%s: %w: it is a directory", a.To, ErrExists)
		}
		if !a.Overwrite {
			return nil, fmt.Errorf("%s: %w (set \"overwrite\": true to replace it)", a.To, ErrExists)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if dir := filepath.Dir(to); dir != "." {
		if err := s.root.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := s.root.Rename(from, to); err != nil {
		return nil, err
	}
	return &MoveResult{From: filepath.ToSlash(from), To: filepath.ToSlash(to)}, nil
}

// fileTarget resolves p for a tool that needs a file, not the root itself.
func (s *Sandbox) fileTarget(p string) (string, error) {
	rel, err := s.Resolve(p)
	if err != nil {
		return "", err
	}
	if rel == "." {
		return "", fmt.Errorf("%w: %s is the sandbox root, not a file", ErrBadPath, p)
	}
	return rel, nil
}
