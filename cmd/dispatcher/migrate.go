package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
)

const migrateUsage = `usage: dispatcher migrate up|down|status
  up      apply every pending migration of the schema (LLMQ_DATABASE_URL)
  down    revert the latest applied migration (its Down section)
  status  list the migrations this binary knows, applied or pending

Workers and dispatcher serve never migrate: they refuse to start on a
schema older or newer than theirs. dispatcher dev migrates by itself.
Processes migrating at once take turns; one that waits for a lock (another
migration, or a table a long transaction holds) more than 10s gives up
and changes nothing.`

// migrate runs `dispatcher migrate up|down|status`.
func migrate(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	action := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	if err := cmdline.Parse(flag.NewFlagSet("migrate "+action, flag.ContinueOnError), args, stdout, migrateUsage); err != nil {
		return err
	}
	switch action {
	case "up", "down", "status":
	case "":
		return cmdline.Usagef("dispatcher migrate takes one of up, down or status (dispatcher migrate -h)")
	default:
		if cmdline.IsHelp(action) {
			fmt.Fprintln(stdout, migrateUsage)
			return nil
		}
		return cmdline.Usagef("unknown migrate action %q: want up, down or status", action)
	}
	// The worker's validation: every variable a process needs, no admin token.
	env, logger, err := app.LoadEnv(environ, config.RoleWorker, stderr)
	if err != nil {
		return err
	}
	db, err := store.Connect(ctx, env.DatabaseURL, logger)
	if err != nil {
		return fmt.Errorf("open store (LLMQ_DATABASE_URL): %w", err)
	}
	defer db.Close()
	switch action {
	case "up":
		applied, err := db.MigrateUp(ctx)
		if err != nil {
			return err
		}
		_, want, err := db.SchemaVersion(ctx)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintf(stdout, "the schema is up to date (version %d)\n", want)
			return nil
		}
		fmt.Fprintf(stdout, "applied %s; the schema is at version %d\n", versions(applied), want)
	case "down":
		v, err := db.MigrateDown(ctx)
		if err != nil {
			return err
		}
		if v == 0 {
			fmt.Fprintln(stdout, "no migration is applied: nothing to revert")
			return nil
		}
		have, _, err := db.SchemaVersion(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "reverted %03d; the schema is at version %d\n", v, have)
	case "status":
		return printStatus(ctx, db, stdout)
	}
	return nil
}

func printStatus(ctx context.Context, db *store.DB, stdout io.Writer) error {
	sts, err := db.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	have, want, err := db.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tAPPLIED")
	for _, s := range sts {
		when := "pending"
		if s.Applied {
			when = s.AppliedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%03d\t%s\t%s\n", s.Version, s.Name, when)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case have == want:
		fmt.Fprintf(stdout, "the schema is at version %d, this binary's\n", have)
	case have < want:
		fmt.Fprintf(stdout, "the schema is at version %d, this binary's is %d: dispatcher migrate up applies the rest\n", have, want)
	default:
		fmt.Fprintf(stdout, "the schema is at version %d, newer than this binary's %d\n", have, want)
	}
	return nil
}

func versions(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%03d", v)
	}
	return strings.Join(s, ", ")
}
