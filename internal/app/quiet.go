package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
)

// QuietRedis sends go-redis's own log lines (a dial that failed, a pool
// that retried) to the process logger at debug, instead of its global
// logger's raw lines on stderr: what the user sees of an unreachable Redis
// is llmq's one line naming LLMQ_REDIS_URL. go-redis's logger is global, so
// only a program's main calls this, once, before any client exists.
func QuietRedis(environ []string, stderr io.Writer) {
	env, err := config.LoadEnv(environ)
	if err != nil {
		env = &config.Env{} // the run reports the variable; log as the defaults say
	}
	redis.SetLogger(redisLogger{env.Logger(stderr)})
}

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if r.l.Enabled(ctx, slog.LevelDebug) {
		r.l.DebugContext(ctx, "redis client", "line", fmt.Sprintf(format, v...))
	}
}
