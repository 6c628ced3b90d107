package apptest

import (
	"context"
	"log/slog"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/config"
)

// OpenEnviron reads and validates the LLMQ_* variables of environ for role
// and opens the app on a migrated database; provider keys are read from
// environ too unless parts says otherwise. Programs that build an llmq from
// an environment of their own (the benchmarks, a second dispatcher in a
// test) use it.
func OpenEnviron(ctx context.Context, environ []string, role config.Role, logger *slog.Logger, parts app.Parts) (*app.App, error) {
	env, err := config.LoadEnv(environ)
	if err != nil {
		return nil, err
	}
	if err := env.Validate(role); err != nil {
		return nil, err
	}
	if parts.LookupEnv == nil {
		parts.LookupEnv = app.LookupIn(environ)
	}
	parts.Migrate = true
	return app.Open(ctx, env, logger, parts)
}
