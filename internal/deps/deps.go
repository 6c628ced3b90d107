//go:build tools

// Package deps pins the modules the project builds on while the packages that
// use them are being written; go mod tidy keeps what is imported here.
package deps

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/caarlos0/env/v11"
	_ "github.com/chromedp/chromedp"
	_ "github.com/go-redis/redis_rate/v10"
	_ "github.com/goccy/go-yaml"
	_ "github.com/hibiken/asynq"
	_ "github.com/hibiken/asynq/x/metrics"
	_ "github.com/hibiken/asynqmon"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/sashabaranov/go-openai"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/tiktoken-go/tokenizer"
	_ "go.uber.org/goleak"
	_ "modernc.org/sqlite"
)
