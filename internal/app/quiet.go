package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
)

// QuietRedis sends go-redis's own log lines to the process logger at debug
// instead of stderr. go-redis's logger is global: only a main calls this.
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
