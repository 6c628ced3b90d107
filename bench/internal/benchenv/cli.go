package benchenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a benchmark program: run with the command's arguments and
// standard output, under a context cancelled at SIGINT or SIGTERM (so the
// run stops and removes what it made). An error is printed after the
// program's name and the program exits 1; a run that returns flag.ErrHelp
// (-h: the flag set printed its usage) is no error.
func Main(name string, run func(ctx context.Context, args []string, out io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// EnvOr is the environment variable name's value, or def when it is unset
// or empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Backends are the Redis and Postgres servers a run uses, from its flags
// -redis, -redis-db and -database (see Flags); a program's options embed
// them.
type Backends struct {
	// RedisURL is the Redis server, whose database RedisDB the run uses
	// (Redis's function replaces the URL's database number).
	RedisURL string
	RedisDB  int
	// DatabaseURL is the Postgres database the run makes its schemas in.
	DatabaseURL string
}

// Flags defines -redis (TEST_REDIS_URL, else the local server), -redis-db
// (bench/'s database, 10) and -database (TEST_DATABASE_URL, else the local
// test database) on fs. schemas names what makes a schema of its own in
// the database, for the help: "each scenario", "the run".
func (b *Backends) Flags(fs *flag.FlagSet, schemas string) {
	fs.StringVar(&b.RedisURL, "redis", EnvOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis server (its database number is replaced by -redis-db)")
	fs.IntVar(&b.RedisDB, "redis-db", 10, "Redis database (10 is bench/'s, docs/ARCHITECTURE.md)")
	fs.StringVar(&b.DatabaseURL, "database", EnvOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"Postgres database; "+schemas+" makes a schema of its own there and drops it")
}

// Check returns an error when a flag is out of range.
func (b *Backends) Check() error {
	if b.RedisDB < 0 {
		return fmt.Errorf("-redis-db must not be negative, got %d", b.RedisDB)
	}
	return nil
}
