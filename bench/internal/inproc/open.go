package inproc

import (
	"context"
	"log/slog"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/testutil"
)

// Options say what Open opens an llmq over.
type Options struct {
	benchenv.Backends
	// Name names its Postgres schema (bench_<name>_…), temporary directory
	// and namespace (bench-<name>-…).
	Name string
	// Policy is the policy file's template and SimURL, RPM and TPM what
	// replaces its placeholders (benchenv.WritePolicy).
	Policy   string
	SimURL   string
	RPM, TPM int64
	// Environ gives the workers' concurrency, the shutdown timeout and any
	// extra variables; Open fills in the rest.
	Environ benchenv.Environ
	// Parts are the app's parts; Open sets their Redis.
	Parts app.Parts
	// OnRedis, when set, sees the Redis client before the app opens (to
	// add a hook that counts its round trips).
	OnRedis func(*redis.Client)
}

// LLMQ is an llmq opened in this process, as a dispatcher opens it.
type LLMQ struct {
	*app.App
	Redis *redis.Client
	// DSN is its schema's database URL; Environ its environment, for
	// processes started beside it.
	DSN     string
	Environ []string
}

// Open opens an llmq over a Postgres schema of its own, database RedisDB of
// the Redis server (its keys and queues under a namespace of its own,
// purged when it closes) and a policy file from o.Policy. What undoes each
// step is appended to closers as the step succeeds.
func Open(ctx context.Context, o Options, logger *slog.Logger, closers *benchenv.Closers) (*LLMQ, error) {
	dsn, drop, err := testutil.NewSchema(ctx, o.DatabaseURL, "bench_"+o.Name+"_")
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, drop)
	rdb, redisURL, err := benchenv.Redis(ctx, o.RedisURL, o.RedisDB)
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { _ = rdb.Close() })
	if o.OnRedis != nil {
		o.OnRedis(rdb)
	}
	dir, err := os.MkdirTemp("", "llmq-bench-"+o.Name+"-")
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { _ = os.RemoveAll(dir) })
	policyPath, err := benchenv.WritePolicy(dir, o.Policy, o.SimURL, o.RPM, o.TPM)
	if err != nil {
		return nil, err
	}
	env := o.Environ
	env.RedisURL, env.DatabaseURL, env.PolicyPath = redisURL, dsn, policyPath
	env.Namespace = "bench-" + o.Name + "-" + testutil.RandomHex(4)
	environ := env.List()
	parts := o.Parts
	parts.Redis = rdb
	a, err := apptest.OpenEnviron(ctx, environ, config.RoleDispatcher, logger, parts)
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, a.Close, func() { testutil.PurgeRedis(rdb, a.Queue.Namespace().Queues(), a.Keys.Prefix()) })
	return &LLMQ{App: a, Redis: rdb, DSN: dsn, Environ: environ}, nil
}
