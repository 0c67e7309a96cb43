// Package programs lists Assent's programs, their commands and each
// command's flags: the very flag sets the programs parse, made by the same
// code, so that what is listed is what runs. docs/configuration.md is
// generated from it, and deployment files are checked against it.
package programs

import (
	"flag"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/worker"
)

//go:generate go run ./gendoc -doc ../../docs/configuration.md

// Program is one of Assent's programs (a command under cmd/).
type Program struct {
	// Name is the program's: "broker", "approver-bot", "agent-worker",
	// "mcp-gateway".
	Name     string
	Commands []Command
}

// Command is one command of a program, with its flags.
type Command struct {
	// Name is the command's, as typed after the program's name ("run",
	// "policy check"); "" for the broker's serving command, "broker [flags]".
	Name string
	// Flags is a new flag set with the command's flags, unparsed. Each flag
	// also comes from the environment variable envflag.Var(name).
	Flags *flag.FlagSet
}

// All returns every program and its commands, with new flag sets.
func All() []Program {
	broker := Program{Name: "broker", Commands: []Command{{Name: "", Flags: app.ServeFlagSet()}}}
	for _, name := range app.Commands() {
		broker.Commands = append(broker.Commands, Command{Name: name, Flags: app.CommandFlagSet(name)})
	}
	return []Program{
		broker,
		program("approver-bot", bot.Commands(), bot.FlagSet),
		program("agent-worker", worker.Commands(), worker.FlagSet),
		program("mcp-gateway", mcpgateway.Commands(), mcpgateway.FlagSet),
	}
}

func program(name string, commands []string, flags func(string) *flag.FlagSet) Program {
	p := Program{Name: name}
	for _, c := range commands {
		p.Commands = append(p.Commands, Command{Name: c, Flags: flags(c)})
	}
	return p
}
