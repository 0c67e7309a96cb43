// Package envflag fills a flag set from the environment once the command
// line is parsed: flag --nats-url takes its value from ASSENT_NATS_URL, or
// from the contents of the file named by ASSENT_NATS_URL_FILE (for secrets
// and paths mounted as files). The command line wins over the environment.
//
// Every program of Assent parses its command lines with Parse and shows its
// flags with PrintDefaults, so that each flag's variable is named in -h;
// docs/configuration.md has the whole table.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Prefix starts the name of every variable of Assent's.
const Prefix = "ASSENT_"

// FileSuffix ends the name of a variable holding a file to read the value
// from: ASSENT_NATS_URL_FILE.
const FileSuffix = "_FILE"

// Var returns the environment variable of the flag called flagName:
// "nats-url" gives "ASSENT_NATS_URL".
func Var(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Others are Assent's variables that are not flags: secrets named in a
// configuration file, and the API token of the broker's client commands.
// Parse does not warn about them.
func Others() []string {
	return []string{
		"ASSENT_TOKEN",              // broker audit, remembered: the API token (app.TokenEnv)
		"ASSENT_OIDC_CLIENT_SECRET", // the auth file's default client_secret_env
		"ASSENT_SMTP_PASSWORD",      // the bot's email channel: default password_env
		"ASSENT_EMAIL_LINK_SECRET",  // the bot's email channel: default link_secret_env
	}
}

// Env is an environment to read flags from. The zero Env is empty.
type Env struct {
	// Lookup returns the value of the variable key and whether it is set:
	// os.LookupEnv.
	Lookup func(key string) (string, bool)
	// Environ lists the variables set, as KEY=VALUE (os.Environ), for the
	// warning about ASSENT_ variables that name no flag; nil warns of none.
	Environ func() []string
}

// OS is the process's environment.
func OS() Env {
	return Env{Lookup: os.LookupEnv, Environ: os.Environ}
}

// Map is an environment holding vars, for tests.
func Map(vars map[string]string) Env {
	return Env{
		Lookup: func(key string) (string, bool) {
			v, ok := vars[key]
			return v, ok
		},
		Environ: func() []string {
			var kv []string
			for k, v := range vars {
				kv = append(kv, k+"="+v)
			}
			slices.Sort(kv)
			return kv
		},
	}
}

// Parse parses args into fs, as fs.Parse does, then sets each flag that args
// did not set from its variable (Var): from the variable's value, or from
// the contents of the file that the variable with FileSuffix names, less one
// trailing newline. A repeatable flag takes one value from the environment.
//
// Setting both a variable and its _FILE variable is an error, and so is a
// value the flag refuses; Parse reports them as the flag package reports a
// bad argument, on fs.Output() followed by the usage, and returns them. An
// ASSENT_ variable that names no flag of any of Assent's programs (nor one of
// Others) is warned of, on warn, with the closest flag of fs if there is one:
// a misspelt name. One of another command's or program's flags is not: the
// same environment often serves several of them.
func Parse(fs *flag.FlagSet, args []string, env Env, warn io.Writer) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := apply(fs, env); err != nil {
		fmt.Fprintln(fs.Output(), err)
		fs.Usage()
		return err
	}
	if warn != nil {
		for _, w := range unknown(fs, env) {
			fmt.Fprintf(warn, "%s: warning: %s\n", fs.Name(), w)
		}
	}
	return nil
}

// apply sets the flags of fs that the command line left unset from env.
func apply(fs *flag.FlagSet, env Env) error {
	if env.Lookup == nil {
		return nil
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := Var(f.Name)
		value, ok := env.Lookup(name)
		file, fromFile := env.Lookup(name + FileSuffix)
		source := name
		switch {
		case ok && fromFile:
			errs = append(errs, fmt.Errorf("both %s and %s%s are set, for --%s: unset one", name, name, FileSuffix, f.Name))
			return
		case fromFile:
			data, err := os.ReadFile(file)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s, for --%s: %w", name, FileSuffix, f.Name, err))
				return
			}
			value, source = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r"), name+FileSuffix+" ("+file+")"
		case !ok:
			return
		}
		if err := fs.Set(f.Name, value); err != nil {
			errs = append(errs, fmt.Errorf("%s, for --%s: want %s: %w", source, f.Name, expects(f), err))
		}
	})
	return errors.Join(errs...)
}

// expects says what flag f takes, for an error.
func expects(f *flag.Flag) string {
	switch v := f.Value.(type) {
	case interface{ IsBoolFlag() bool }:
		if v.IsBoolFlag() {
			return "true or false"
		}
	case flag.Getter:
		switch v.Get().(type) {
		case time.Duration:
			return "a duration such as 90s, 5m or 1h30m"
		case int, int64:
			return "a whole number"
		case uint, uint64:
			return "a whole number, 0 or more"
		case float64:
			return "a number"
		}
	}
	name, _ := flag.UnquoteUsage(f)
	if name == "" || name == "value" {
		return "a value as -h describes it"
	}
	return "a " + name
}

// unknown returns a warning for each ASSENT_ variable of env that names no
// flag of fs nor of any other command (known), and is none of Others.
func unknown(fs *flag.FlagSet, env Env) []string {
	if env.Environ == nil {
		return nil
	}
	var warnings []string
	for _, kv := range env.Environ() {
		key, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(key, Prefix) || slices.Contains(Others(), key) {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(strings.TrimSuffix(key, FileSuffix), Prefix), "_", "-"))
		if f := fs.Lookup(name); f != nil && Var(f.Name) == strings.TrimSuffix(key, FileSuffix) {
			continue
		}
		if known[strings.TrimSuffix(key, FileSuffix)] {
			// Another command's or program's: the environment is shared.
			continue
		}
		w := key + " names no flag of any of Assent's programs; it is ignored"
		if near := closest(fs, name); near != "" {
			w += fmt.Sprintf(" (did you mean %s, for --%s?)", Var(near), near)
		}
		warnings = append(warnings, w)
	}
	return warnings
}

// closest returns the flag of fs whose name is nearest name, if one is near
// enough to be a likely slip: a few letters off, or one name within the other.
func closest(fs *flag.FlagSet, name string) string {
	best, bestDist := "", 0
	fs.VisitAll(func(f *flag.Flag) {
		d := distance(name, f.Name)
		near := d <= max(2, len(name)/3) ||
			len(f.Name) >= 3 && strings.Contains(name, f.Name) ||
			len(name) >= 3 && strings.Contains(f.Name, name)
		if near && (best == "" || d < bestDist) {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// PrintDefaults prints the flags of fs as fs.PrintDefaults does, with each
// flag's variable after its description, "(env ASSENT_NATS_URL)", and a
// note on the environment after them.
func PrintDefaults(fs *flag.FlagSet) {
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		shown.Var(f.Value, f.Name, f.Usage+" (env "+Var(f.Name)+")")
		// What was the default, not the value it has now.
		shown.Lookup(f.Name).DefValue = f.DefValue
		n++
	})
	if n == 0 {
		return
	}
	shown.PrintDefaults()
	fmt.Fprint(fs.Output(), note)
}

// note follows the flags in PrintDefaults.
const note = `
A flag not given on the command line is read from its variable (env ...), or
from the file named by that variable with _FILE appended (a mounted secret).
docs/configuration.md lists every variable.
`
