package main

import (
	"strings"
	"testing"
)

// Every command and subcommand answers -h, --help and help with its usage
// on stdout and exit 0 (before, files -h and admin -h exited 2 with
// `unknown command "files "`); a missing subcommand is bad usage that names
// the subcommands; --version prints the module version.
func TestHelpEverywhere(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string // the usage's first line
	}{
		{[]string{"help"}, "usage: llmq COMMAND"},
		{[]string{"-h"}, "usage: llmq COMMAND"},
		{[]string{"--help"}, "usage: llmq COMMAND"},
		{[]string{"help", "jobs"}, "usage: llmq jobs"},
		{[]string{"submit", "-h"}, "usage: llmq submit"},
		{[]string{"submit", "x.jsonl", "--wait", "--help"}, "usage: llmq submit"},
		{[]string{"jobs", "-h"}, "usage: llmq jobs"},
		{[]string{"jobs", "help"}, "usage: llmq jobs"},
		{[]string{"jobs", "list", "-h"}, "usage: llmq jobs"},
		{[]string{"jobs", "get", "--help"}, "usage: llmq jobs"},
		{[]string{"batches", "-h"}, "usage: llmq batches"},
		{[]string{"batches", "cancel", "-h"}, "usage: llmq batches"},
		{[]string{"files", "-h"}, "usage: llmq files"},
		{[]string{"files", "help"}, "usage: llmq files"},
		{[]string{"files", "upload", "-h"}, "usage: llmq files"},
		{[]string{"usage", "-h"}, "usage: llmq usage"},
		{[]string{"admin", "-h"}, "usage: llmq admin"},
		{[]string{"admin", "help"}, "usage: llmq admin"},
		{[]string{"admin", "keys", "-h"}, "usage: llmq admin"},
		{[]string{"admin", "keys", "help"}, "usage: llmq admin"},
		{[]string{"admin", "tenants", "create", "--help"}, "usage: llmq admin"},
	} {
		r := runWith(t, nil, "", c.args...)
		if r.err != nil || !strings.HasPrefix(r.stdout, c.want) || r.stderr != "" {
			t.Errorf("llmq %s: %v\nwant exit 0 and %q", strings.Join(c.args, " "), r, c.want)
		}
		if strings.Contains(r.stdout, "Flags of every command") == false {
			t.Errorf("llmq %s: the usage lacks the common flags", strings.Join(c.args, " "))
		}
	}
	// A command's usage is its own lines, not the whole text.
	r := runWith(t, nil, "", "files", "-h")
	if strings.Contains(r.stdout, "admin tenants") || !strings.Contains(r.stdout, "files content ID") {
		t.Errorf("files -h:\n%s", r.stdout)
	}
	// `llmq jobs list` tells users to use --after: help names it.
	if r := runWith(t, nil, "", "help"); !strings.Contains(r.stdout, "--after ID") {
		t.Errorf("help does not mention --after:\n%s", r.stdout)
	}
	// A value that reads "help" is a value.
	r = runWith(t, []string{"LLMQ_ADMIN_TOKEN=t", "LLMQ_URL=http://127.0.0.1:1"}, "", "admin", "tenants", "create", "--name", "help", "--tier", "x")
	if strings.HasPrefix(r.stdout, "usage:") || !strings.Contains(message(r.err), "cannot reach llmq") {
		t.Errorf("--name help: %v", r)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"files"}, "files needs a subcommand: upload, list, get, content or delete (llmq files -h)"},
		{[]string{"admin"}, "admin needs a subcommand: tenants, keys, usage or retention (llmq admin -h)"},
		{[]string{"admin", "keys"}, "admin keys needs a subcommand: create, list or revoke (llmq admin -h)"},
		{[]string{"admin", "keys", "rotate"}, `unknown command "admin keys rotate": use create, list or revoke`},
		{[]string{"jobs", "purge"}, `unknown command "jobs purge": use list, get, cancel or wait`},
		{[]string{"--colour"}, "flag provided but not defined: -colour (llmq help lists the commands and flags)"},
	} {
		r := runWith(t, nil, "", c.args...)
		if r.code() != exitUsage || !strings.Contains(message(r.err), c.want) || r.stdout != "" || strings.Contains(message(r.err), "\n") {
			t.Errorf("llmq %s: %v\nwant exit 2 and %q in one line", strings.Join(c.args, " "), r, c.want)
		}
	}

	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		r := runWith(t, nil, "", args...)
		if r.err != nil || !strings.HasPrefix(r.stdout, "llmq ") || !strings.Contains(r.stdout, "go1.") {
			t.Errorf("llmq %s: %v", args[0], r)
		}
	}
}
