package limiter

import "github.com/llmq/llmq/internal/testutil"

// must is testutil.Must.
func must[T any](v T, err error) T { return testutil.Must(v, err) }
